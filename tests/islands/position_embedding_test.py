"""kmp.islands.broadcast_once: KerasHub's `PositionEmbedding` repeating one
example's embedding over the batch (what `kmp.pin_float32` does to it on
JAX): KerasHub's values and gradients, on JAX no sum over the batch;
explicit and serving positions, unbatched and empty input left to
KerasHub; a subclass left alone; a `.keras` file does not keep it and
`kmp.load_model` applies it again; under Keras's NNX mode the table
trains in keras-io's NNX loop."""

import sys
from unittest import mock

import keras
import keras_hub
import numpy as np
import pytest
from keras import ops
from util import nnx_only
from util import run_under_nnx
from util import small_gpt2_backbone

import kmp
from kmp import backend
from kmp.islands import broadcast_once
from kmp.islands import broadcasts_once
from kmp.islands import position_embedding

BATCH, LENGTH, FEATURES = 3, 5, 4
# What kmp.pin_float32 does: on JAX only (elsewhere the repeat would be
# KerasHub's broadcast anyway).
PINS = backend.name() == "jax"


def embedding(sequence_length=8, dtype=None):
    layer = keras_hub.layers.PositionEmbedding(sequence_length, dtype=dtype)
    layer.build((None, sequence_length, FEATURES))
    return layer


def activations(batch=BATCH, length=LENGTH):
    rng = np.random.default_rng(0)
    return rng.standard_normal((batch, length, FEATURES)).astype("float32")


def numpy(x):
    return ops.convert_to_numpy(x)


def called_with(layer, table, x):
    """`layer(x)` with `table` for its position embeddings: its own
    `__call__` (autocast to the policy's compute dtype, which
    `stateless_call` skips), differentiable by `table`."""
    mapping = [(layer.position_embeddings, table)]
    with keras.StatelessScope(state_mapping=mapping):
        return layer(x)


# The layer's policy: float32 (KerasHub's broadcast on every backend) and
# a 16-bit one (on JAX, kmp's product with ones).
POLICIES = ["float32", "mixed_bfloat16"]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("start_index", [0, 2])
@pytest.mark.parametrize("batch", [BATCH, 32])  # 32: JAX's product
def test_it_returns_keras_hub_s_values(start_index, policy, batch):
    layer, x = embedding(dtype=policy), activations(batch=batch)
    want = numpy(ops.cast(layer(x, start_index=start_index), "float32"))
    broadcast_once(layer)
    broadcast_once(layer)  # a second time changes nothing
    assert broadcasts_once(layer)
    got = layer(x, start_index=start_index)
    np.testing.assert_array_equal(numpy(ops.cast(got, "float32")), want)


@pytest.mark.parametrize("policy, rtol", zip(POLICIES, [1e-6, 2e-2]))
def test_the_table_s_gradient_is_keras_hub_s(policy, rtol):
    # A batch of 32: on JAX the 16-bit table takes kmp's product.
    layer, x = embedding(dtype=policy), activations(batch=32)
    weights = activations(batch=32) * 3.0

    def gradient():
        def loss_fn(values, args, tap):
            out = called_with(layer, values[0], args[0])
            return ops.sum(ops.cast(out, "float32") * args[1])

        run = backend.taped_gradients(loss_fn)
        _, _, _, (table_gradient,), _ = run(
            [layer.position_embeddings.value], x, weights
        )
        return numpy(table_gradient)

    want = gradient()
    broadcast_once(layer)
    got = gradient()
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
    # Positions past the sequence get nothing; the first LENGTH get the
    # sum over the batch.
    np.testing.assert_allclose(
        got[:LENGTH], weights.sum(0), rtol=rtol, atol=rtol * 10
    )
    assert not got[LENGTH:].any()


def test_explicit_positions_take_keras_hub_s_call():
    # Each example its own positions: one example's embedding repeated
    # would be wrong for the others.
    layer, x = embedding(), activations()
    positions = np.array([[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [7, 7, 7, 7, 7]])
    want = numpy(layer(x, positions=positions))
    broadcast_once(layer)
    np.testing.assert_array_equal(numpy(layer(x, positions=positions)), want)


def test_positions_given_by_position_take_keras_hub_s_call():
    layer, x = embedding(), activations()
    positions = np.array([[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [7, 7, 7, 7, 7]])
    start = ops.convert_to_tensor(0)  # Keras takes tensors by position only
    want = numpy(layer(x, start, positions))
    broadcast_once(layer)
    np.testing.assert_array_equal(numpy(layer(x, start, positions)), want)


@pytest.mark.parametrize(
    "shape",
    [(LENGTH, FEATURES), (0, LENGTH, FEATURES), (2, 3, LENGTH, FEATURES)],
    ids=["unbatched", "empty batch", "rank 4"],
)
def test_unbatched_empty_and_deeper_inputs_get_keras_hub_s_values(shape):
    layer = embedding()
    x = np.ones(shape, "float32")
    want = numpy(layer(x, start_index=1))
    broadcast_once(layer)
    got = numpy(layer(x, start_index=1))
    assert got.shape == want.shape == shape
    np.testing.assert_array_equal(got, want)


def test_keras_hub_s_serving_positions_take_keras_hub_s_call():
    # vLLM's paged serving: one flat sequence of tokens, each with its
    # own position (KerasHub's module function gives them).
    layer = embedding()
    x = activations(batch=6, length=1)
    served = ops.convert_to_tensor(np.array([3, 0, 5, 1, 1, 2]).reshape(-1, 1))
    module = sys.modules[type(layer).__module__]
    with mock.patch.object(module, "_vllm_serving_positions", lambda: served):
        want = numpy(layer(x))
        broadcast_once(layer)
        got = numpy(layer(x))
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got[0], got[1])


@pytest.mark.skipif(backend.name() != "jax", reason="JAX's program")
@pytest.mark.parametrize("once", [True, False])
def test_on_jax_the_table_s_gradient_sums_nothing_over_the_batch(once):
    import jax

    layer, x = embedding(dtype="mixed_bfloat16"), activations(batch=32)
    if once:
        broadcast_once(layer)

    def loss(table, x):
        out = called_with(layer, table, x)
        return ops.sum(ops.cast(out, "float32") * x)

    text = (
        jax.jit(jax.grad(loss))
        .lower(layer.position_embeddings.value, x)
        .as_text()
    )
    # KerasHub's own call sums the (32, 5, 4) gradient over the batch.
    batch_sum = "across dimensions = [0] : (tensor<32x5x4x"
    assert (batch_sum in text) is not once


def test_pin_float32_applies_it_to_keras_hub_s_layer_only():
    class Shifted(keras_hub.layers.PositionEmbedding):
        def call(self, inputs, start_index=0, positions=None):
            return super().call(inputs, start_index) + 1.0

    kmp.enable("mixed_bfloat16")
    inputs = keras.Input((LENGTH, FEATURES))
    stock = keras_hub.layers.PositionEmbedding(8)
    own = Shifted(8)
    outputs = keras.layers.Add()([stock(inputs), own(inputs)])
    kmp.pin_float32(keras.Model(inputs, outputs))
    assert broadcasts_once(stock) is PINS
    assert not broadcasts_once(own)
    assert not position_embedding.is_keras_hub_position_embedding(own)


def test_a_layer_pinned_by_also_keeps_the_wrapper():
    # Pinned to float32, its repeat is then the plain broadcast
    # (kmp.backend.broadcast_over_batch takes the product in 16 bits).
    kmp.enable("mixed_bfloat16")
    inputs = keras.Input((LENGTH, FEATURES))
    layer = keras_hub.layers.PositionEmbedding(8, name="positions")
    outputs = keras.layers.Add()([inputs, layer(inputs)])
    kmp.pin_float32(keras.Model(inputs, outputs), also=["positions"])
    assert layer.dtype_policy.name == "float32"
    assert broadcasts_once(layer) is PINS


def test_gpt2_gets_it_from_pin_float32_and_again_from_load_model(tmp_path):
    kmp.enable("mixed_bfloat16")
    backbone = small_gpt2_backbone()
    data = {
        "token_ids": np.arange(2 * 16).reshape(2, 16) % 64,
        "padding_mask": np.ones((2, 16), "bool"),
    }
    layer = backbone.get_layer("position_embedding")
    embedded = backbone.get_layer("token_embedding")(data["token_ids"])
    want = numpy(ops.cast(layer(embedded), "float32"))
    kmp.pin_float32(backbone)
    assert broadcasts_once(layer) is PINS
    got = numpy(ops.cast(layer(embedded), "float32"))
    np.testing.assert_array_equal(got, want)

    path = str(tmp_path / "gpt2.keras")
    backbone.save(path)
    loaded = keras.saving.load_model(path)
    assert not broadcasts_once(loaded.get_layer("position_embedding"))
    loaded = kmp.load_model(path)
    assert broadcasts_once(loaded.get_layer("position_embedding")) is PINS
    np.testing.assert_allclose(
        numpy(ops.cast(loaded(data), "float32")),
        numpy(ops.cast(backbone(data), "float32")),
        rtol=1e-6,
    )


def test_keras_hub_s_token_and_position_embedding_trains_with_it():
    # keras-io's "GPT text generation from scratch with KerasHub" builds
    # its model on keras_hub.layers.TokenAndPositionEmbedding, which
    # makes a PositionEmbedding inside.
    kmp.enable("mixed_bfloat16")
    inputs = keras.Input((LENGTH,), dtype="int32")
    embed = keras_hub.layers.TokenAndPositionEmbedding(20, LENGTH, FEATURES)
    outputs = keras.layers.Dense(20)(embed(inputs))
    model = keras.Model(inputs, outputs)
    ids = np.arange(64 * LENGTH).reshape(64, LENGTH) % 20
    want = numpy(ops.cast(embed(ids), "float32"))
    kmp.pin_float32(model)
    assert broadcasts_once(embed.position_embedding) is PINS
    got = numpy(ops.cast(embed(ids), "float32"))
    np.testing.assert_array_equal(got, want)
    model.compile(
        optimizer=kmp.wrap("adam"),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    before = numpy(embed.position_embedding.position_embeddings)
    # Batches of 32: on JAX the product with ones.
    history = model.fit(ids, ids, epochs=1, batch_size=32, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    after = numpy(embed.position_embedding.position_embeddings)
    assert (before != after).any(axis=1).all()  # every position learned


@nnx_only
def test_gpt2_s_table_trains_in_keras_io_s_nnx_loop(tmp_path_factory):
    # nnx.grad runs a copy of the model, whose call closed over the
    # original layer: the table got no gradient (moved 0 in 20 steps,
    # with the decoder's wrapper fixed). Now as in float32.
    result = run_under_nnx("gpt2", tmp_path_factory)
    reference, pinned = result["float32"], result["mixed_bfloat16"]
    assert "error" not in pinned, pinned.get("error")
    assert pinned["broadcast_once"] and not reference["broadcast_once"]
    table = "position_embedding/embeddings"
    assert pinned["moved"][table] > 0.01
    assert pinned["moved"][table] == pytest.approx(
        reference["moved"][table], rel=0.05
    )
    assert pinned["loss"] == pytest.approx(reference["loss"], abs=1e-3)
