"""kmp.fp8.float8_layers: kmp's own float8 layers, their saving, and the
HLO pattern XLA rewrites into FP8 GEMMs."""

import re

import keras
import numpy as np
import pytest
from keras import ops

import kmp
from kmp import backend
from kmp.fp8.matmuls import matmul_sizes
from kmp.fp8.matmuls import projections


def numpy(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_float8_dense_is_dense_to_float8_precision(policy):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64)).astype("float32")
    with kmp.policy_scope(policy):
        dense = keras.layers.Dense(48)
        float8 = kmp.layers.Float8Dense(48)
        dense.build((None, 64))
        float8.build((None, 64))
    float8.set_weights(dense.get_weights() + float8.get_weights()[2:])
    expected, got = numpy(dense(x)), numpy(float8(x))
    assert got.dtype == expected.dtype
    assert np.any(got != expected)  # float8 rounding happened
    # Each error, bounded from the formats (the bias is zero): an operand
    # rounded to E4M3 at its scale s = amax / 448 is off by at most 2^-4
    # of itself (3 mantissa bits) plus half the smallest subnormal,
    # 2^-10 s, and by the compute dtype's half-ulp u when scaled back;
    # both products are rounded to the compute dtype as well.
    kernel = numpy(dense.kernel).astype("float64")
    u = {"mixed_bfloat16": 2.0**-8, "mixed_float16": 2.0**-11}[policy]

    def operand_error(a):
        return (2.0**-4 + u) * np.abs(a) + 2.0**-10 * np.abs(a).max() / 448

    ax, aw = np.abs(x.astype("float64")), np.abs(kernel)
    ex, ew = operand_error(x.astype("float64")), operand_error(kernel)
    bound = ex @ aw + ax @ ew + ex @ ew + 4 * u * (ax @ aw)
    assert np.all(np.abs(got.astype("float64") - expected) <= bound)


def test_amax_history_is_recorded_in_training_only():
    with kmp.policy_scope("mixed_bfloat16"):
        layer = kmp.layers.Float8Dense(16, amax_history_length=3)
        layer.build((None, 16))
    x = np.full((2, 16), 2.0, "float32")
    layer(x, training=False)
    assert numpy(layer.inputs_amax_history).tolist() == [0, 0, 0]
    layer(x, training=True)
    layer(3 * x, training=True)
    assert numpy(layer.inputs_amax_history).tolist() == [6, 2, 0]
    x[0, 0] = np.inf  # an overflowing batch is not recorded
    layer(x, training=True)
    assert numpy(layer.inputs_amax_history).tolist() == [0, 6, 2]
    kernel_amax = np.abs(numpy(layer.kernel)).max()
    assert numpy(layer.kernel_amax_history)[0] == pytest.approx(
        kernel_amax, rel=1e-2
    )


@pytest.mark.parametrize("length", [0, -1, 2.5, True, "16"])
def test_amax_history_length_must_be_a_positive_int(length):
    with pytest.raises(ValueError, match="amax_history_length must be"):
        kmp.layers.Float8Dense(16, amax_history_length=length)


def test_multi_head_attention_projections_are_float8():
    with kmp.policy_scope("mixed_bfloat16"):
        attention = kmp.layers.Float8MultiHeadAttention(num_heads=2, key_dim=16)
        x = np.ones((2, 4, 32), "float32")
        out = attention(x, x)
    assert out.shape == (2, 4, 32)
    kinds = {type(d).__name__ for d in projections(attention)}
    assert kinds == {"Float8EinsumDense"}
    assert type(attention._softmax).__name__ == "Float32Softmax"
    assert matmul_sizes(attention._query_dense) == (32, 32)
    assert matmul_sizes(attention._output_dense) == (32, 32)


def test_save_and_load_keep_the_classes_and_histories(tmp_path):
    with kmp.policy_scope("mixed_bfloat16"):
        inputs = keras.Input((4, 32))
        x = kmp.layers.Float8MultiHeadAttention(2, 16)(inputs, inputs)
        x = kmp.layers.Float8Dense(32, amax_history_length=4)(x)
        model = keras.Model(inputs, keras.layers.Dense(3, dtype="float32")(x))
    data = np.random.default_rng(0).standard_normal((8, 4, 32))
    model(data, training=True)  # records amaxes
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert [type(layer).__name__ for layer in loaded.layers[1:3]] == [
        "Float8MultiHeadAttention",
        "Float8Dense",
    ]
    assert loaded.layers[2].amax_history_length == 4
    for a, b in zip(model.variables, loaded.variables):
        np.testing.assert_array_equal(numpy(a), numpy(b))
    np.testing.assert_array_equal(
        numpy(model.predict(data, verbose=0)),
        numpy(loaded.predict(data, verbose=0)),
    )


# XLA's GPU GEMM rewriter makes a float8 cuBLASLt GEMM of a dot whose
# operands are `convert(f8) * broadcast(scalar)`, through layout-only ops
# (gemm_rewriter.cc, MatchFp8Param), and refuses E5M2 x E5M2. A CPU's
# compiled HLO has no such call, so the unoptimized HLO is checked.
_PASS_THROUGH = {
    "bitcast",
    "broadcast",
    "copy",
    "reshape",
    "transpose",
    "slice",
}


def _float8_operand(name, instructions):
    """The float8 type feeding `name` as `convert(f8) * scalar`, or None."""
    op, operands, _ = instructions[name]
    while op in _PASS_THROUGH - {"broadcast"}:
        op, operands, _ = instructions[operands[0]]
    if op != "multiply":
        return None
    kinds = [instructions[o] for o in operands]
    converts = [k for k in kinds if k[0] == "convert"]
    scalars = [k for k in kinds if k[0] == "broadcast"]
    if len(converts) != 1 or len(scalars) != 1:
        return None
    source = instructions[converts[0][1][0]][2]
    return source if source.startswith("f8") else None


def _keras_float8_dense(units):
    layer = keras.layers.Dense(units)
    layer.build((4, 8, 16))
    layer.quantize("float8")
    return layer


@pytest.mark.skipif(backend.name() != "jax", reason="reads JAX's HLO")
@pytest.mark.parametrize(
    "make",
    [kmp.layers.Float8Dense, _keras_float8_dense],
    ids=["kmp", "keras"],  # Keras's own: what kmp's scaler makes loss-free
)
def test_every_matmul_has_the_pattern_xla_rewrites_into_fp8_gemms(make):
    import jax
    import jax.numpy as jnp

    with kmp.policy_scope("mixed_bfloat16"):
        layer = make(32)
        if not layer.built:  # Keras quantizes built layers only
            layer.build((4, 8, 16))
    trainable = [v.value for v in layer.trainable_variables]
    state = [v.value for v in layer.non_trainable_variables]

    def loss(trainable, x):
        y, _ = layer.stateless_call(trainable, state, x, training=True)
        return jnp.sum(jnp.square(y.astype("float32")))

    x = np.ones((4, 8, 16), "float32")
    text = (
        jax.jit(jax.grad(loss, argnums=(0, 1)))
        .lower(trainable, x)
        .as_text(dialect="hlo")
    )
    instructions = {}
    for match in re.finditer(
        r"^\s*(?:ROOT )?(\S+) = (\w+)\[[^\]]*\]\S* (\w+)\(([^)]*)\)",
        text,
        re.MULTILINE,
    ):
        name, dtype, op, operands = match.groups()
        operands = [o.strip() for o in operands.split(",") if o.strip()]
        instructions[name] = (op, operands, dtype)
    dots = [v[1] for v in instructions.values() if v[0] == "dot"]
    pairs = sorted(
        tuple(sorted(_float8_operand(o, instructions) or "none" for o in d))
        for d in dots
    )
    # Forward E4M3 x E4M3; input and kernel gradients E4M3 x E5M2.
    assert pairs == [
        ("f8e4m3fn", "f8e4m3fn"),
        ("f8e4m3fn", "f8e5m2"),
        ("f8e4m3fn", "f8e5m2"),
    ]
