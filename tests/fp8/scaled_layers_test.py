"""kmp.fp8.scaled_layers: `kmp.float8(model, matmul="kmp")`, Keras's float8
layers computed by kmp's own float8 matmul on JAX and torch."""

import keras
import numpy as np
import pytest

# The subclassed model (layers made in code, as KerasHub's) and the
# lowered program's float8 dot_generals, as kmp.float8's other tests read
# them.
from convert_test import PureSubclassed  # noqa: E402
from scaled_matmul_test import _dot_generals  # noqa: E402
from util import torch_calls

import kmp
from kmp import backend
from kmp.fp8 import scaled_layers

jax_only = pytest.mark.skipif(
    backend.name() != "jax", reason="reads JAX's lowered program"
)
kmp_matmul = pytest.mark.skipif(
    backend.name() not in ("jax", "torch"),
    reason="kmp's float8 matmul is JAX's and torch's",
)


@pytest.mark.parametrize(
    "equation, rank, plan",
    [
        ("ab,bc->ac", 2, ([0, 1], [0, 1], (1, 1), [0, 1])),
        # An attention's query projection and its output projection.
        ("btd,dnh->btnh", 3, ([0, 1, 2], [0, 1, 2], (2, 1), [0, 1, 2, 3])),
        ("btnh,nhd->btd", 4, ([0, 1, 2, 3], [0, 1, 2], (2, 2), [0, 1, 2])),
        ("...b,bc->...c", 4, ([0, 1, 2, 3], [0, 1], (3, 1), [0, 1, 2, 3])),
        # Contracted axis first in the input, kernel axes out of order,
        # output in another order: transposes on each side.
        ("dt,nd->nt", 2, ([1, 0], [1, 0], (1, 1), [1, 0])),
        # A batch axis shared by the input, the kernel and the output, and
        # an axis summed over the input alone: not one matmul.
        ("abc,acd->abd", 3, None),
        ("abc,cd->ad", 3, None),
    ],
)
def test_an_einsum_equation_is_planned_as_one_matmul_or_refused(
    equation, rank, plan
):
    assert scaled_layers.matmul_plan(equation, rank) == plan


def model(seed=0):
    """Three convertible layers (a Dense and an attention's two kinds of
    projection) and a float32 head, under mixed_bfloat16."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((16, 64))
    x = keras.layers.Dense(64, name="dense")(inputs)
    x = keras.layers.EinsumDense("btd,dnh->btnh", (16, 4, 16), name="q")(x)
    x = keras.layers.EinsumDense(
        "btnh,nhd->btd", (16, 64), bias_axes="d", name="o"
    )(x)
    outputs = keras.layers.Dense(8, dtype="float32", name="head")(x)
    return keras.Model(inputs, outputs)


def data(count=32):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((count, 16, 64)).astype("float32")
    y = rng.standard_normal((count, 16, 8)).astype("float32")
    return x, y


def converted(matmul="kmp"):
    with kmp.policy_scope("mixed_bfloat16"):
        net = kmp.float8(model(), matmul=matmul)
        net.compile(
            optimizer=kmp.wrap(keras.optimizers.Adam(1e-3)),
            loss="mse",
            # XLA on JAX; on torch, Keras's default (eager), where each
            # aten call can be counted.
            jit_compile=backend.name() == "jax",
        )
    return net


@jax_only
def test_the_train_step_runs_each_converted_layer_s_three_matmuls_on_float8():
    import jax

    net = converted()
    assert [type(layer) for layer in net.layers[1:]] == [
        scaled_layers.Dense,
        scaled_layers.EinsumDense,
        scaled_layers.EinsumDense,
        keras.layers.Dense,
    ]
    net.optimizer.build(net.trainable_variables)
    state = tuple(
        [v.value for v in variables]
        for variables in (
            net.trainable_variables,
            net.non_trainable_variables,
            net.optimizer.variables,
            net.metrics_variables,
        )
    )
    # Keras's own train step (the one `fit` compiles), with the optimizer.
    text = jax.jit(net.train_step).lower(state, data(8)).as_text()
    dots = _dot_generals(text)
    float8 = [
        d for d in dots if d[0].startswith("f8") and d[1].startswith("f8")
    ]
    # Per converted layer: the forward (E4M3 x E4M3), the input's and the
    # kernel's gradients (E5M2 against E4M3); the first layer's input
    # needs no gradient, and JAX drops that matmul. Under mixed_bfloat16
    # each GEMM writes bfloat16 itself (the kernel is cast to the
    # compute dtype before the matmul, so its gradient is bfloat16 too).
    forward = ("f8E4M3FN", "f8E4M3FN", "bf16")
    input_gradient = ("f8E5M2", "f8E4M3FN", "bf16")
    kernel_gradient = ("f8E4M3FN", "f8E5M2", "bf16")
    assert sorted(float8) == sorted(
        3 * [forward, kernel_gradient] + 2 * [input_gradient]
    )
    # What is left is the float32 head's three matmuls.
    assert len(dots) - len(float8) == 3
    assert all(not d[0].startswith("f8") for d in dots if d not in float8)


@jax_only
@pytest.mark.parametrize("matmul", ["kmp", "keras", None])
def test_a_float8_layer_s_gelu_is_differentiated_as_written(matmul):
    # kmp.pin_float32 makes a GELU recompute in the backward pass (it
    # pays in a 16-bit GEMM's epilogue); a float8 layer's is not
    # recomputed (kmp.islands.gelu says why), whichever matmul it has.
    import jax

    with kmp.policy_scope("mixed_bfloat16"):
        inputs = keras.Input((16, 64))
        hidden = keras.layers.Dense(64, activation="gelu", name="gelu")(inputs)
        net = keras.Model(inputs, keras.layers.Dense(8)(hidden))
        layer = net.get_layer("gelu")
        kmp.pin_float32(net)
        assert kmp.islands.recomputes_gelu(layer)
        if matmul:
            kmp.float8(net, matmul=matmul, min_size=0)
            assert layer.quantization_mode == "float8"
            assert isinstance(layer, scaled_layers.Dense) is (matmul == "kmp")
    x, _ = data(2)

    frozen = [v.value for v in net.non_trainable_variables]

    def loss(values):
        out, _ = net.stateless_call(values, frozen, x)
        return (out.astype("float32") ** 2).sum()

    values = [v.value for v in net.trainable_variables]
    text = str(jax.make_jaxpr(jax.grad(loss))(values))
    # Keras's GELU (exact) computes `erfc` once; recomputed, once more in
    # the backward pass.
    assert text.count(" erfc ") == (1 if matmul else 2)


@pytest.mark.skipif(backend.name() != "torch", reason="counts torch's calls")
def test_a_torch_train_step_runs_each_converted_layer_s_matmuls_as_scaled_mm(
    monkeypatch,
):
    import torch

    from kmp.fp8 import _torch_matmul

    # As on a GPU with float8 tensor cores (torch_matmul_test.py: on a
    # CPU kmp multiplies the float8 values dequantized instead).
    monkeypatch.setattr(_torch_matmul, "_scaled_mm_runs", lambda device: True)
    net = converted()
    x, y = data(8)
    net.train_on_batch(x, y)  # builds the optimizer outside the count
    matmuls = (torch.ops.aten.mm.default, torch.ops.aten.bmm.default)
    calls = [
        (args[0].dtype, args[1].dtype, out.dtype)
        if func is torch.ops.aten._scaled_mm.default
        else ("matmul", out.dtype)
        for func, args, out in torch_calls(lambda: net.train_on_batch(x, y))
        if func is torch.ops.aten._scaled_mm.default or func in matmuls
    ]
    e4m3, e5m2, bf16 = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16
    float8 = [c for c in calls if c[0] != "matmul"]
    # As on JAX: each converted layer's forward and kernel gradient, the
    # input gradients of all but the first (its input needs none).
    assert sorted(float8, key=str) == sorted(
        3 * [(e4m3, e4m3, bf16), (e4m3, e5m2, bf16)] + 2 * [(e5m2, e4m3, bf16)],
        key=str,
    )
    # The rest: the float32 head's forward and two gradients.
    assert [c for c in calls if c[0] == "matmul"] == 3 * [
        ("matmul", torch.float32)
    ]


@kmp_matmul
def test_the_outputs_are_bfloat16_s_to_float8_precision():
    with kmp.policy_scope("mixed_bfloat16"):
        reference = model()
        net = kmp.float8(model(), matmul="kmp")
    x, _ = data()
    want = reference.predict(x, verbose=0)
    got = net.predict(x, verbose=0)
    # Three E4M3 matmuls in a row, ~3.7 % each in quadrature: ~6.4 %.
    error = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert 0 < error < 0.1


@kmp_matmul
def test_it_trains_and_leaves_keras_s_float8_state_as_it_was():
    net = converted()
    state = {
        v.path: np.array(v.numpy())
        for v in net.weights
        if getattr(v, "overwrite_with_gradient", False)
    }
    # Still trainable: the same trainable set as Keras's float8 layers.
    assert state and all(v.trainable for v in net.weights if v.path in state)
    x, y = data()
    history = net.fit(x, y, batch_size=8, epochs=3, verbose=0)
    losses = history.history["loss"]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    for v in net.weights:
        if v.path in state:
            np.testing.assert_array_equal(v.numpy(), state[v.path])


@kmp_matmul
def test_a_keras_file_keeps_kmp_s_matmul(tmp_path):
    net = converted()
    x, y = data()
    net.fit(x, y, batch_size=8, epochs=1, verbose=0)
    path = tmp_path / "model.keras"
    net.save(path)
    loaded = kmp.load_model(path)
    assert [type(layer) for layer in loaded.layers] == [
        type(layer) for layer in net.layers
    ]
    np.testing.assert_array_equal(
        loaded.predict(x, verbose=0), net.predict(x, verbose=0)
    )
    loaded.fit(x, y, batch_size=8, epochs=1, verbose=0)


@kmp_matmul
def test_keras_s_float8_layers_are_given_kmp_s_matmul_when_asked_again():
    net = converted(matmul="keras")
    x, y = data()
    net.fit(x, y, batch_size=8, epochs=1, verbose=0)
    traced = net.train_function  # with Keras's float8 call
    assert traced is not None
    assert kmp.float8(net, matmul="kmp") is net
    assert (
        sum(
            isinstance(layer, scaled_layers.SCALED_CLASSES)
            for layer in net.layers
        )
        == 3
    )
    assert net.train_function is not traced  # made afresh
    net.fit(x, y, batch_size=8, epochs=1, verbose=0)


def test_an_unknown_matmul_is_refused_with_the_choices():
    with kmp.policy_scope("mixed_bfloat16"):
        net = model()
    with pytest.raises(ValueError, match="'keras'.*'kmp'"):
        kmp.float8(net, matmul="cublas")


@pytest.mark.skipif(
    backend.name() in ("jax", "torch"), reason="this backend has it"
)
def test_kmp_s_matmul_on_tensorflow_is_refused_with_the_way_out():
    with kmp.policy_scope("mixed_bfloat16"):
        net = model()
    with pytest.raises(ValueError, match="JAX's and torch's.*matmul='keras'"):
        kmp.float8(net, matmul="kmp")


@kmp_matmul
def test_a_subclassed_model_s_file_loads_and_takes_kmp_s_matmul_again(
    tmp_path,
):
    x = np.random.default_rng(0).normal(size=(8, 16)).astype("float32")
    with kmp.policy_scope("mixed_bfloat16"):
        net = PureSubclassed()
        net(x)
        with pytest.warns(UserWarning, match="made by code of yours"):
            kmp.float8(net, matmul="kmp")
        net.compile(optimizer=kmp.wrap("adam"), loss="mse")
        net.fit(x, x, epochs=1, verbose=0)
        net.save(tmp_path / "net.keras")
    # Rebuilt by its own code: Keras's float8 layers, kmp's weights.
    loaded = keras.saving.load_model(tmp_path / "net.keras")
    assert type(loaded.up) is keras.layers.Dense
    assert loaded.up.quantization_mode == "float8"
    for name in ("up", "mid", "head"):
        mine, theirs = getattr(net, name), getattr(loaded, name)
        np.testing.assert_array_equal(
            mine.kernel.numpy(), theirs.kernel.numpy()
        )
    kmp.float8(loaded, matmul="kmp")
    assert type(loaded.up) is scaled_layers.Dense
    np.testing.assert_array_equal(
        loaded.predict(x, verbose=0), net.predict(x, verbose=0)
    )


def test_min_size_converts_only_kernels_large_enough_to_pay():
    with kmp.policy_scope("mixed_bfloat16"):
        inputs = keras.Input((64,))
        x = keras.layers.Dense(256, name="wide")(inputs)  # 64*256/320 = 51.2
        x = keras.layers.Dense(48, name="thin")(x)  # 256*48/304 = 40.4
        outputs = keras.layers.Dense(16, dtype="float32", name="head")(x)
        net = keras.Model(inputs, outputs)
    kmp.float8(net, min_size=50)
    assert [layer.quantization_mode for layer in net.layers[1:]] == [
        "float8",
        None,
        None,
    ]
    # `also` converts a layer whatever its size.
    kmp.float8(net, min_size=50, also=["thin"])
    assert net.get_layer("thin").quantization_mode == "float8"


@kmp_matmul
@pytest.mark.parametrize(
    "devices, converted",
    [
        # kmp's matmul on a GPU with float8 tensor cores: GPU_MIN_SIZE
        # (here 50) applies; on an A100 (8.0) or a CPU, every layer.
        ([("gpu", "H200", (9, 0))], ["float8", None, None]),
        ([("gpu", "A100", (8, 0))], ["float8", "float8", None]),
        ([("cpu", "host", None)], ["float8", "float8", None]),
    ],
)
def test_the_default_min_size_reads_the_device(devices, converted, monkeypatch):
    from kmp.fp8 import convert

    monkeypatch.setattr(convert, "GPU_MIN_SIZE", 50)
    monkeypatch.setattr(
        backend, "list_devices", lambda: [backend.Device(*d) for d in devices]
    )
    with kmp.policy_scope("mixed_bfloat16"):
        inputs = keras.Input((64,))
        x = keras.layers.Dense(256, name="wide")(inputs)  # 51.2
        x = keras.layers.Dense(48, name="thin")(x)  # 40.4
        outputs = keras.layers.Dense(16, dtype="float32", name="head")(x)
        net = keras.Model(inputs, outputs)
    kmp.float8(net)
    modes = [layer.quantization_mode for layer in net.layers[1:]]
    assert modes == converted
    # Keras's float8 path pays at no size measured: every eligible layer.
    assert convert.default_min_size("keras") == 0


@pytest.mark.parametrize("min_size", [-1, "big", True, float("nan")])
def test_a_bad_min_size_is_refused_with_what_it_takes(min_size):
    with kmp.policy_scope("mixed_bfloat16"):
        net = model()
    with pytest.raises(ValueError, match="number >= 0"):
        kmp.float8(net, min_size=min_size)
