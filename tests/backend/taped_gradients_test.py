"""Gradients by intermediate tensors (`kmp.backend._taped_gradients`), through
`kmp.backend.taped_gradients`, on each backend."""

import keras
import numpy as np
import pytest
from keras import ops

from kmp import backend
from kmp.backend import _taped_gradients


@pytest.mark.parametrize("jit_compile", [False, True])
def test_taped_gradients_by_values_and_tapped_tensors(jit_compile):
    def loss_fn(values, args, tap):
        (w,) = values
        (x,) = args
        h = tap("h", ops.cast(w * x, "float16"))
        unused = tap("unused", ops.cast(x, "float16"))
        del unused
        return ops.sum(ops.square(ops.cast(h, "float32")))

    run = backend.taped_gradients(loss_fn, jit_compile)
    x = np.array([1.0, 2.0, 3.0], "float32")
    loss, keys, taps, value_grads, tap_grads = run([np.float32(2.0)], x)
    assert keys == ["h", "unused"]
    assert float(loss) == 4 + 16 + 36
    np.testing.assert_array_equal(ops.convert_to_numpy(taps[0]), 2 * x)
    # d/dh sum(h^2) = 2h, in h's dtype (float16).
    assert keras.backend.standardize_dtype(tap_grads[0].dtype) == "float16"
    np.testing.assert_array_equal(ops.convert_to_numpy(tap_grads[0]), 4 * x)
    # d/dw sum((w x)^2) = 2 w sum(x^2) = 56.
    assert float(value_grads[0]) == 56.0
    unused = tap_grads[1]
    assert unused is None or not np.any(ops.convert_to_numpy(unused))


def _loss_through_a_constant(values, args, tap):
    (w,) = values
    # The tapped tensor does not depend on `w`: a cast of the input.
    h = tap("h", ops.cast(args[0], "float16"))
    return ops.sum(ops.cast(h, "float32") * w)


def test_a_tapped_tensor_no_value_flows_into_still_gets_its_gradient():
    run = backend.taped_gradients(_loss_through_a_constant)
    x = np.array([1.0, 2.0], "float32")
    _, _, _, value_grads, tap_grads = run([np.float32(3.0)], x)
    np.testing.assert_array_equal(ops.convert_to_numpy(tap_grads[0]), [3, 3])
    assert float(value_grads[0]) == 3.0


@pytest.mark.backend_independent
def test_an_unknown_backend_is_refused_by_name():
    with pytest.raises(ValueError, match="TensorFlow, JAX or PyTorch"):
        _taped_gradients.maker("numpy")
