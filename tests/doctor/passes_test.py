"""The doctor's two passes (`kmp.doctor._passes`): float32 and mixed over
one batch, with the gradients of the scaled loss, and nothing left
behind."""

import keras
import numpy as np
import pytest

import kmp
from kmp.doctor import _inputs
from kmp.doctor._passes import two_passes
from kmp.doctor._taps import observed_layers


def _chain(policy="mixed_float16"):
    """x -> identity Dense "a" -> all-ones Dense "b" (the sum of x)."""
    with kmp.policy_scope(policy):
        inputs = keras.Input((3,))
        x = keras.layers.Dense(
            3, use_bias=False, kernel_initializer="identity", name="a"
        )(inputs)
        outputs = keras.layers.Dense(
            1, use_bias=False, kernel_initializer="ones", name="b"
        )(x)
        model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss="mse")
    return model


def _prepared(model, scale=8.0):
    x = np.array([[1.0, 2.0, 3.0], [0.0, 1.0, 1.0]], "float32")
    y = np.zeros((2, 1), "float32")
    return _inputs.prepare(
        model,
        (x, y),
        loss=None,
        batches=1,
        loss_scale=scale,
        policy=None,
        batch_size=2,
        jit_compile=False,
    )


def _dtypes(tensors):
    return [keras.backend.standardize_dtype(t.dtype) for t in tensors]


def _numpy(tensors):
    return [keras.ops.convert_to_numpy(t) for t in tensors]


def test_reference_in_float32_mixed_in_half_at_the_loss_scale():
    model = _chain()
    inputs = _prepared(model, scale=8.0)
    layers = observed_layers(model)
    assert [layer.name for layer in layers] == ["a", "b"]
    with two_passes(inputs, layers) as run:
        reference, mixed = run(*inputs.batches[0])
    assert reference.keys == mixed.keys == [0, 1]
    assert _dtypes(reference.outputs) == ["float32", "float32"]
    assert _dtypes(mixed.outputs) == ["float16", "float16"]
    # b sums x: outputs [6, 2]; mse over 2 examples: d loss / d b = [6, 2];
    # d loss / d a = that, per feature; d loss / d kernel_b = x^T [6, 2].
    ref_b, ref_a = _numpy(reference.output_gradients)[::-1]
    np.testing.assert_array_equal(ref_b, [[6.0], [2.0]])
    np.testing.assert_array_equal(ref_a, [[6.0] * 3, [2.0] * 3])
    np.testing.assert_array_equal(
        _numpy(reference.weight_gradients)[1], [[6.0], [14.0], [20.0]]
    )
    # The mixed pass differentiates the loss times 8, exactly here.
    for ref, half in zip(
        _numpy(reference.weight_gradients + reference.output_gradients),
        _numpy(mixed.weight_gradients + mixed.output_gradients),
    ):
        np.testing.assert_array_equal(8.0 * ref, half.astype("float32"))


def test_policies_and_calls_are_restored_also_after_an_error():
    model = _chain()
    inputs = _prepared(model)
    layers = observed_layers(model)
    before = [layer._dtype_policy for layer in layers]
    with pytest.raises(RuntimeError, match="stop"):
        with two_passes(inputs, layers) as run:
            run(*inputs.batches[0])
            assert all("call" in layer.__dict__ for layer in layers)
            raise RuntimeError("stop")
    assert [layer._dtype_policy for layer in layers] == before
    assert not any("call" in layer.__dict__ for layer in layers)
