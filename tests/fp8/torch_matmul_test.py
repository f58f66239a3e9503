"""kmp.fp8._torch_matmul: kmp's float8 matmul in torch's calls. Where
`_scaled_mm` is fast (a GPU with float8 tensor cores; made to think it
is on this CPU, `scaled_mm`), every GEMM of a forward and backward pass
is a `torch._scaled_mm` on float8 operands laid out as CUDA's FP8 GEMM
takes them, rows padded where the kernel's gradient needs it; elsewhere
the same float8 values are multiplied dequantized, to the same products.
(Its numerics against float32: scaled_matmul_test.)"""

import numpy as np
import pytest
from util import torch_calls

from kmp import backend
from kmp.fp8.scaled_matmul import float8_matmul

torch_only = pytest.mark.skipif(
    backend.name() != "torch", reason="torch's float8 matmul"
)


@pytest.fixture
def scaled_mm(monkeypatch):
    """`_scaled_mm` as on a GPU with float8 tensor cores: the CPU's kernel
    is a slow reference loop (kmp uses it on no CPU), correct for the
    small sizes here."""
    from kmp.fp8 import _torch_matmul

    monkeypatch.setattr(_torch_matmul, "_scaled_mm_runs", lambda device: True)


def data(rows=128, k=64, n=32, dtype="bfloat16", seed=0):
    import torch

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, k)).astype("float32")
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype("float32")
    c = rng.standard_normal((rows, n)).astype("float32")
    dtype = getattr(torch, dtype)
    return (
        torch.tensor(x, dtype=dtype, requires_grad=True),
        torch.tensor(w, dtype=dtype, requires_grad=True),
        torch.tensor(c),
    )


def record(step):
    """Runs `step()`, returning every `_scaled_mm` and `mm` call it made:
    `(name, operands, result dtype)`, each operand `(dtype, shape,
    strides)`."""
    import torch

    watched = {
        torch.ops.aten._scaled_mm.default: "_scaled_mm",
        torch.ops.aten.mm.default: "mm",
        torch.ops.aten.bmm.default: "bmm",
    }
    return [
        (
            watched[func],
            [(a.dtype, tuple(a.shape), a.stride()) for a in args[:2]],
            out.dtype,
        )
        for func, args, out in torch_calls(step)
        if func in watched
    ]


def forward_and_backward(x, w, c):
    def step():
        (float8_matmul(x, w).float() * c).sum().backward()

    return step


@torch_only
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_all_three_matmuls_are_scaled_mm_writing_the_result_dtype(
    dtype, scaled_mm
):
    import torch

    x, w, c = data(dtype=dtype)
    calls = record(forward_and_backward(x, w, c))
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
    out = getattr(torch, dtype)
    # The scales are applied in the GEMM's float32 epilogue, so it writes
    # the result dtype itself, float16 included; no other matmul runs.
    found = sorted(
        [(name, (a[0], b[0]), d) for name, (a, b), d in calls], key=str
    )
    assert found == sorted(
        [
            ("_scaled_mm", (e4m3, e4m3), out),  # y = x @ w
            ("_scaled_mm", (e5m2, e4m3), out),  # dx = g @ w^T
            ("_scaled_mm", (e4m3, e5m2), out),  # dw = x^T @ g
        ],
        key=str,
    )
    assert torch.isfinite(x.grad).all() and torch.isfinite(w.grad).all()


def _row_major(shape, strides):
    return strides == (shape[1], 1)


def _column_major(shape, strides):
    return strides == (1, shape[0])


@torch_only
@pytest.mark.parametrize("rows", [128, 100, 7])
def test_operands_are_laid_out_and_sized_as_cuda_s_fp8_gemm_takes_them(
    rows, scaled_mm
):
    # CUDA's _scaled_mm: the first operand row-major, the second
    # column-major, every size but the first operand's rows a multiple of
    # 16. The CPU kernel takes more, so the layouts are checked here.
    x, w, c = data(rows=rows)
    calls = record(forward_and_backward(x, w, c))
    assert len(calls) == 3
    for _, ((_, a_shape, a_strides), (_, b_shape, b_strides)), _ in calls:
        assert _row_major(a_shape, a_strides), (a_shape, a_strides)
        assert _column_major(b_shape, b_strides), (b_shape, b_strides)
        assert a_shape[1] % 16 == 0 and b_shape[1] % 16 == 0
    # The kernel's gradient contracts over the rows, padded to 16's
    # multiple with zeros; the results keep the rows asked for.
    padded = -(-rows // 16) * 16
    contracted = sorted(a_shape[1] for _, ((_, a_shape, _), _), _ in calls)
    assert padded in contracted
    assert tuple(x.grad.shape) == (rows, 64) and tuple(w.grad.shape) == (64, 32)


@torch_only
def test_padded_rows_change_nothing(scaled_mm):
    # The first 7 rows alone give the same product and input gradient as
    # within 16 rows whose others are zero: zeros add nothing, to a
    # product or an amax.
    import torch

    x, w, c = data(rows=16)
    with torch.no_grad():
        x[7:] = 0
        c[7:] = 0
    forward_and_backward(x, w, c)()
    short_x = x[:7].detach().clone().requires_grad_()
    short_w = w.detach().clone().requires_grad_()
    forward_and_backward(short_x, short_w, c[:7])()
    torch.testing.assert_close(
        float8_matmul(short_x, short_w), float8_matmul(x, w)[:7], rtol=0, atol=0
    )
    torch.testing.assert_close(short_x.grad, x.grad[:7], rtol=0, atol=0)
    torch.testing.assert_close(short_w.grad, w.grad, rtol=0, atol=0)


@torch_only
def test_elsewhere_the_same_float8_values_are_multiplied_dequantized(
    monkeypatch,
):
    # On this CPU (as on a GPU without float8 tensor cores) the float8
    # values are multiplied dequantized, in float32 here: the products
    # _scaled_mm gives, to float32's rounding (sums of 64 or 128 terms,
    # in another order).
    from kmp.fp8 import _torch_matmul

    x, w, c = data(dtype="float32", seed=1)
    calls = record(forward_and_backward(x, w, c))
    assert [(name, d) for name, _, d in calls] == 3 * [("mm", x.dtype)]
    got = (float8_matmul(x, w), x.grad.clone(), w.grad.clone())
    monkeypatch.setattr(_torch_matmul, "_scaled_mm_runs", lambda device: True)
    x.grad = w.grad = None
    forward_and_backward(x, w, c)()
    want = (float8_matmul(x, w), x.grad, w.grad)
    for g, r in zip(got, want):
        np.testing.assert_allclose(
            g.detach().numpy(), r.detach().numpy(), rtol=1e-5, atol=1e-4
        )


@torch_only
def test_kept_state_gets_a_copy_of_its_value_as_its_gradient():
    # Keras writes such a gradient over the variable (overwrite_with_
    # gradient); a gradient sharing the variable's storage would be
    # zeroed with the gradients.
    import torch

    from kmp.fp8 import _torch_matmul

    y = torch.ones(3, requires_grad=True)
    state = torch.nn.Parameter(torch.tensor([2.0, 3.0]))
    _torch_matmul.keep(y * 2, [state]).sum().backward()
    assert y.grad.tolist() == [2.0, 2.0, 2.0]
    assert state.grad.tolist() == [2.0, 3.0]
    assert state.grad.data_ptr() != state.data_ptr()


def bits(q):
    import torch

    return q.view(torch.uint8)


@torch_only
@pytest.mark.parametrize(
    "dtype, fmt",
    [("bfloat16", "float8_e4m3fn"), ("float32", "float8_e5m2")],
)
def test_the_compiled_quantization_gives_the_eager_bits(dtype, fmt):
    # The function a GPU compiles, compiled here by Inductor's C++ code
    # (a GPU's Triton code may round its divisions otherwise), on tensors
    # of other shapes than it first compiled for, a non-finite one
    # included: the eager bits.
    import torch

    from kmp.fp8 import _torch_matmul

    compiled = torch.compile(_torch_matmul._quantize, dynamic=True)
    generator = torch.Generator().manual_seed(0)
    for rows, cols, bad in [(48, 32, None), (80, 16, None), (32, 48, "inf")]:
        x = torch.randn(rows, cols, generator=generator) * 3
        x = x.to(getattr(torch, dtype))
        if bad:
            x[1, 2] = float(bad)
        (q, scale), (q_eager, scale_eager) = (
            compiled(x, fmt),
            _torch_matmul._quantize(x, fmt),
        )
        assert torch.equal(bits(q), bits(q_eager))
        assert torch.equal(scale, scale_eager)  # inf for the inf


@pytest.fixture
def compiling(monkeypatch):
    """`quantize` as on a CUDA GPU with float8 tensor cores; the fixture
    is `use(compiler)`, which makes torch.compile return
    `compiler(function)` and returns the list of `(function, options)`
    it was called with."""
    import torch

    from kmp.fp8 import _torch_matmul

    monkeypatch.setattr(_torch_matmul, "_compiles", lambda device: True)
    monkeypatch.setattr(_torch_matmul, "_compiled", None)
    compiled = []

    def use(compiler):
        def compile(function, **options):
            compiled.append((function, options))
            return compiler(function)

        monkeypatch.setattr(torch, "compile", compile)
        return compiled

    return use


@torch_only
def test_where_it_compiles_quantize_runs_compiled_once_for_every_shape(
    compiling,
):
    import torch

    from kmp.fp8 import _torch_matmul

    calls = []
    compiled = compiling(lambda f: lambda *a: calls.append(a) or f(*a))
    x = torch.randn(32, 16)
    _torch_matmul.quantize(x, "float8_e4m3fn")
    _torch_matmul.quantize(x[:16], "float8_e5m2")
    assert [options for _, options in compiled] == [{"dynamic": True}]
    assert [a[1] for a in calls] == ["float8_e4m3fn", "float8_e5m2"]
    # A dispatch mode (a profiler's, a count of aten calls) sees eager
    # calls, not a compile.
    from util import torch_calls

    torch_calls(lambda: _torch_matmul.quantize(x, "float8_e4m3fn"))
    assert len(calls) == 2


@torch_only
def test_a_failed_compile_warns_once_then_quantizes_eagerly(compiling):
    import torch

    from kmp.fp8 import _torch_matmul

    def fails(function):
        def run(*args):
            raise torch._dynamo.exc.TorchDynamoException("no Triton here")

        return run

    compiling(fails)
    x = torch.randn(32, 16, dtype=torch.bfloat16)
    with pytest.warns(UserWarning, match="could not compile.*no Triton here"):
        q, scale = _torch_matmul.quantize(x, "float8_e4m3fn")
    q_eager, scale_eager = _torch_matmul._quantize(x, "float8_e4m3fn")
    assert torch.equal(bits(q), bits(q_eager)) and scale == scale_eager
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _torch_matmul.quantize(x, "float8_e4m3fn")  # eager, silently


@torch_only
def test_an_error_of_the_computation_is_not_taken_for_a_failed_compile(
    compiling,
):
    import torch

    from kmp.fp8 import _torch_matmul

    def out_of_memory(function):
        def run(*args):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")

        return run

    compiling(out_of_memory)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        _torch_matmul.quantize(torch.randn(32, 16), "float8_e4m3fn")


@torch_only
@pytest.mark.parametrize("context", ["compiling", "refused"])
def test_inside_a_compiled_step_or_where_torch_compile_refuses_it_runs_eager(
    context, compiling, monkeypatch
):
    # Inside a compiled step (Keras's jit_compile=True) Dynamo traces the
    # eager function with the rest; where torch.compile refuses this
    # Python when it is made, kmp warns and stays eager.
    import torch

    from kmp.fp8 import _torch_matmul

    x = torch.randn(32, 16)
    if context == "compiling":
        compiled = compiling(lambda f: pytest.fail("compiled inside a step"))
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        q, _ = _torch_matmul.quantize(x, "float8_e4m3fn")
        assert compiled == []
    else:

        def refuses(function):
            raise RuntimeError("torch.compile is not supported on Python 3.99+")

        compiling(refuses)
        with pytest.warns(UserWarning, match="not supported on Python"):
            q, _ = _torch_matmul.quantize(x, "float8_e4m3fn")
        assert _torch_matmul._compiled is False
    assert torch.equal(
        bits(q), bits(_torch_matmul._quantize(x, "float8_e4m3fn")[0])
    )


@torch_only
def test_only_a_cuda_gpu_with_fast_float8_compiles_it(monkeypatch):
    import torch

    from kmp.fp8 import _torch_matmul

    assert not _torch_matmul._compiles(torch.device("cpu"))
    # A CPU's _scaled_mm said fast (the tests' fixture) is still a CPU.
    monkeypatch.setattr(_torch_matmul, "_scaled_mm_runs", lambda device: True)
    assert not _torch_matmul._compiles(torch.device("cpu"))
    assert _torch_matmul._compiles(torch.device("cuda"))
    monkeypatch.setattr(_torch_matmul, "_scaled_mm_runs", lambda device: False)
    assert not _torch_matmul._compiles(torch.device("cuda"))
