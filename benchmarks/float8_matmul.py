"""kmp's float8 matmul (`kmp.fp8.float8_matmul`) against bfloat16 matmuls,
forward and backward, on bare JAX.

    KERAS_BACKEND=jax python benchmarks/float8_matmul.py           # GPU
    KERAS_BACKEND=jax python benchmarks/float8_matmul.py \
        --size=1024,2048,4096,8192 --tokens=8192   # where float8 pays
    KERAS_BACKEND=jax python benchmarks/float8_matmul.py --size=256

A stack of `layers` square kernels (`size` x `size`, bfloat16) applied to
`tokens` x `size` bfloat16 activations, a mean-square loss, and its
gradients with respect to every kernel and the input, under `jax.jit`:

- `bf16`: `jnp.dot` on the bfloat16 operands;
- `float8`: `float8_matmul`, whose forward and two backward matmuls are
  `dot_general`s on float8 operands (issue 41's target on an H100:
  >= 1.5x bf16 at size 8192, tokens 8192, 4 layers).

`--forms` adds other ways of writing float8_matmul's GEMM (its `_dot`,
replaced while the step is traced; the quantization is the same):

- `out32`: the float8 `dot_general` writes float32 for every output
  dtype, rescaled and cast after (kmp's form until 2026-11-28, when the
  H200 measured the 16-bit output faster at every size: a bfloat16
  result is now written as bfloat16 by the GEMM itself);
- `dequantized`: XLA's pattern, each float8 operand converted to the
  output's dtype and multiplied by its scale, then a dot in that dtype:
  XLA's GEMM rewriter folds both scales into cuBLASLt's FP8 GEMM, which
  writes the output's dtype (Flax's and Keras's form). The scales are
  rounded up to powers of two, so that a bfloat16 scale is exact.
- `noamax`: no amax at all, every scale 1 (the operands clipped to the
  float8 range and cast): not a recipe (a tensor's range is not
  known), a bound. What it saves against `float8` is what the amax
  passes cost, the most a scaling that reads each tensor once (delayed
  scaling, from earlier steps' amax) could save. The stack's tensors
  are near 1 in size, so its losses stay close.

The two are timed interleaved (`common.time_interleaved`), `steps` steps
a round. TFLOP/s count the 3 matmuls of each layer (2 * tokens * size**2
FLOPs each). `--size` takes a comma-separated list, each size measured
in turn in the same process (the JSON is rewritten after each, so a time
limit keeps what was measured): the sizes at which float8 starts to pay
are what `kmp.float8`'s rule needs. Writes a JSON file with the device
and versions.

On a CPU XLA emulates float8 dots: `--size=256` checks that the script
runs, not float8's speed.
"""

import argparse
import contextlib
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from kmp import backend  # noqa: E402
from kmp.fp8 import scaled_matmul  # noqa: E402
from kmp.fp8.scaled_matmul import float8_matmul  # noqa: E402

MATMULS = {
    "bf16": lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.bfloat16),
    "float8": float8_matmul,
}


def _dimensions(contract):
    return (((contract[0],), (contract[1],)), ((), ()))


def _dot_out32(a, a_scale, b, b_scale, contract, dtype):
    """The GEMM writes float32 whatever the output's dtype."""
    y = jax.lax.dot_general(
        a, b, _dimensions(contract), preferred_element_type=jnp.float32
    )
    return (y * (a_scale * b_scale)).astype(dtype)


def _dot_dequantized(a, a_scale, b, b_scale, contract, dtype):
    """XLA's dequantize-then-dot pattern, in the output's dtype."""
    a = a.astype(dtype) * a_scale.astype(dtype)
    b = b.astype(dtype) * b_scale.astype(dtype)
    return jax.lax.dot_general(
        a, b, _dimensions(contract), preferred_element_type=dtype
    )


def _quantize_power_of_two(x, dtype):
    """float8_matmul's quantization with its scale rounded up to a power
    of two (exact in bfloat16; amax then maps to (max/2, max])."""
    limit = scaled_matmul.FLOAT8_MAX[dtype]
    x = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(x))
    # log2 keeps a NaN amax NaN (kmp's loss scale must see it).
    scale = jnp.where(amax > 0, jnp.exp2(jnp.ceil(jnp.log2(amax / limit))), 1.0)
    return jnp.clip(x / scale, -limit, limit).astype(dtype), scale


def _quantize_unit(x, dtype):
    """`noamax`: the cast alone, scale 1."""
    limit = scaled_matmul.FLOAT8_MAX[dtype]
    q = jnp.clip(x.astype(jnp.float32), -limit, limit).astype(dtype)
    return q, jnp.float32(1.0)


# Each form: what replaces float8_matmul's `_dot` and `quantize`.
FORMS = {
    "out32": {"_dot": _dot_out32},
    "dequantized": {
        "_dot": _dot_dequantized,
        "quantize": _quantize_power_of_two,
    },
    "noamax": {"quantize": _quantize_unit},
}


@contextlib.contextmanager
def _form(name):
    """float8_matmul written as `name` while a step is traced (its
    custom VJP's backward is traced after the forward returns, so the
    whole trace and lowering run inside)."""
    replaced = FORMS.get(name.partition(" ")[2], {})
    saved = {attr: getattr(scaled_matmul, attr) for attr in replaced}
    for attr, function in replaced.items():
        setattr(scaled_matmul, attr, function)
    try:
        yield
    finally:
        for attr, function in saved.items():
            setattr(scaled_matmul, attr, function)


# How XLA's GPU GEMM rewriter names a float8 GEMM in the compiled HLO.
FP8_GEMM = "__cublas$lt$matmul$f8"


def train_step(matmul):
    """A jitted step: the loss and its gradients by the input and every
    kernel."""

    def loss(x, kernels):
        for w in kernels:
            x = matmul(x, w)
        return jnp.mean(jnp.square(x.astype("float32")))

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def stack(size, tokens, layers, seed=0):
    """Activations and kernels scaled to keep the stack's outputs ~1."""
    keys = jax.random.split(jax.random.PRNGKey(seed), layers + 1)
    x = jax.random.normal(keys[0], (tokens, size), "bfloat16")
    kernels = [
        (jax.random.normal(k, (size, size)) / size**0.5).astype("bfloat16")
        for k in keys[1:]
    ]
    return x, kernels


def measure(size, tokens, layers, steps, rounds, forms=()):
    """One size's record: each matmul's step time, TFLOP/s, loss and FP8
    GEMM count, and each float8 form's speed against bf16."""
    x, kernels = stack(size, tokens, layers)
    matmuls = dict(MATMULS)
    matmuls.update({f"float8 {form}": float8_matmul for form in forms})
    runs, losses, gemms = {}, {}, {}
    for name, matmul in matmuls.items():
        step = train_step(matmul)
        with _form(name):
            losses[name] = float(step(x, kernels)[0])  # traces, compiles
            # The FP8 GEMMs XLA compiled (cuBLASLt's float8 custom
            # calls, on a GPU of compute capability 8.9+; a CPU
            # emulates: 0).
            compiled = step.lower(x, kernels).compile().as_text()
        gemms[name] = compiled.count(FP8_GEMM)

        def run(step=step):
            for _ in range(steps):
                out = step(x, kernels)
            jax.block_until_ready(out)

        runs[name] = run
    seconds = common.time_interleaved(runs, rounds)
    return common.matmul_stack_record(
        size, tokens, layers, seconds, steps, losses, {"fp8_gemms": gemms}
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.matmul_stack_arguments(parser)
    parser.add_argument(
        "--forms",
        default="",
        help=f"float8 GEMM forms also timed, comma-separated: {list(FORMS)}",
    )
    args = parser.parse_args()
    forms = [form for form in args.forms.split(",") if form]
    unknown = sorted(set(forms) - set(FORMS))
    if unknown:
        parser.error(f"--forms takes {sorted(FORMS)}; got {unknown}")
    if backend.name() != "jax":
        raise SystemExit("float8_matmul.py runs on JAX: KERAS_BACKEND=jax")
    device = jax.devices()[0]
    print(
        f"device: {device.platform} {device.device_kind}, jax {jax.__version__}"
    )
    common.measure_matmul_stacks(
        args,
        lambda size, tokens: measure(
            size, tokens, args.layers, args.steps, args.rounds, forms
        ),
        {"benchmark": "float8_matmul", "device_kind": device.device_kind},
        ("fp8_gemms", "FP8 GEMMs"),
    )


if __name__ == "__main__":
    main()
