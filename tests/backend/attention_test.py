"""kmp.backend.causal_attention: Keras's causal attention with the mask
given; the window a cuDNN call gets, which keeps the keys up to it
(JAX's own implementation standing in for cuDNN on this CPU); and when
the window is told: JAX, a cuDNN and GPU that take it, and a compile
that succeeds, else Keras's call."""

import numpy as np
import pytest
from keras import ops
from util import window_calls

from kmp import backend
from kmp.backend import attention

ON_JAX = backend.name() == "jax"
jax_only = pytest.mark.skipif(not ON_JAX, reason="JAX's attention")

BATCH, LENGTH, HEADS, HEAD_DIM = 2, 8, 2, 4


def operands(seed=0):
    rng = np.random.default_rng(seed)
    query, key, value = (
        rng.standard_normal((BATCH, LENGTH, HEADS, HEAD_DIM)).astype("float32")
        for _ in range(3)
    )
    return query, key, value


def mask(window=None, padding=2):
    """A causal mask `(batch, 1, queries, keys)` with the second example
    left-padded by `padding` and, given `window`, each query seeing the
    `window` keys up to itself."""
    i = np.arange(LENGTH)[:, None]
    j = np.arange(LENGTH)[None, :]
    square = j <= i
    if window is not None:
        square &= i - j < window
    keys = np.ones((BATCH, LENGTH), bool)
    keys[1, :padding] = False
    return (square[None] & keys[:, None, :])[:, None]


def numpy(x):
    return ops.convert_to_numpy(x)


def keras_s(query, key, value, window):
    return ops.dot_product_attention(
        query, key, value, mask=mask(window), scale=0.3, is_causal=True
    )


@pytest.fixture
def windows(monkeypatch):
    return window_calls(monkeypatch)


@pytest.fixture
def told(monkeypatch):
    """The window told here as on a GPU that takes it, JAX's own
    attention standing in for cuDNN's."""
    monkeypatch.setattr(attention, "_takes_window", lambda *args: True)
    monkeypatch.setattr(attention, "IMPLEMENTATION", "xla")


def test_without_a_window_it_is_keras_s_causal_attention():
    query, key, value = operands()
    got = backend.causal_attention(query, key, value, mask(), 0.3)
    np.testing.assert_array_equal(
        numpy(got), numpy(keras_s(query, key, value, None))
    )


@jax_only
@pytest.mark.parametrize("window", [1, 3, 5])
def test_a_told_window_keeps_each_query_s_keys_up_to_it(window, told, windows):
    # The mask given here lacks the window (KerasHub's has it): the
    # values then show what the window alone keeps.
    query, key, value = operands()
    got = backend.causal_attention(
        query, key, value, mask(), 0.3, window=window
    )
    assert windows == [(window - 1, 0)]
    want = keras_s(query, key, value, window)
    np.testing.assert_allclose(numpy(got), numpy(want), rtol=1e-6)
    wider = keras_s(query, key, value, window + 1)
    assert not np.allclose(numpy(got), numpy(wider))


@jax_only
def test_a_window_as_long_as_the_keys_is_not_told(told, windows):
    query, key, value = operands()
    backend.causal_attention(query, key, value, mask(), 0.3, window=LENGTH)
    assert windows == [None]  # Keras's call: nothing to skip


def test_here_the_window_gets_keras_s_call(windows):
    # No cuDNN on this machine (and no JAX attention on the others).
    query, key, value = operands()
    want = keras_s(query, key, value, 3)
    windows.clear()
    got = backend.causal_attention(query, key, value, mask(3), 0.3, window=3)
    np.testing.assert_array_equal(numpy(got), numpy(want))
    assert windows == ([None] if ON_JAX else [])


def test_a_length_unknown_while_shapes_are_inferred_gets_keras_s_call(
    told,
):
    # keras.Input((None,)) through a layer without compute_output_shape:
    # Keras infers the output on symbolic shapes (JAX's symbolic
    # dimensions), where `window < length` cannot be decided.
    import keras

    def attend(query, key, value):
        mask = ops.ones((1, 1, 1, 1), "bool")
        return backend.causal_attention(query, key, value, mask, 0.3, 3)

    spec = keras.KerasTensor((None, None, HEADS, HEAD_DIM))
    out = keras.src.backend.compute_output_spec(attend, spec, spec, spec)
    assert tuple(out.shape) == (None, None, HEADS, HEAD_DIM)


@jax_only
def test_cudnn_s_version_gpu_and_compile_decide(monkeypatch):
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    query, key, value = operands()
    given = (query, key, value, mask(), 3)
    version, capability = [91002], [True]
    monkeypatch.setattr(cudnn, "check_cudnn_version", lambda: version[0])
    monkeypatch.setattr(
        cudnn, "check_compute_capability", lambda c: capability[0]
    )
    # Here cuDNN's attention does not compile: Keras's call stays, and
    # a warning says so once.
    attention._compiles.cache_clear()
    with pytest.warns(UserWarning, match="did not compile"):
        assert not attention._takes_window(*given)
    assert attention._compiles.cache_info().misses == 1
    attention._takes_window(*given)  # once for these shapes
    assert attention._compiles.cache_info().misses == 1
    monkeypatch.setattr(attention, "_compiles", lambda *args: True)
    assert attention._takes_window(*given)
    version[0] = 91001  # cuDNN 9.10.1 takes no window beside a mask
    assert not attention._takes_window(*given)
    version[0], capability[0] = 91002, False  # older than Ampere
    assert not attention._takes_window(*given)


@jax_only
def test_in_a_traced_step_the_checks_pass_and_the_window_is_told(
    monkeypatch, windows
):
    # The whole path on this CPU: cuDNN's checks answered as a GPU's,
    # JAX's own attention standing in for cuDNN's, whose compile check
    # (forward and backward) runs inside the step's trace.
    import jax
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    monkeypatch.setattr(cudnn, "check_cudnn_version", lambda: 91002)
    monkeypatch.setattr(cudnn, "check_compute_capability", lambda c: True)
    monkeypatch.setattr(attention, "IMPLEMENTATION", "xla")
    attention._compiles.cache_clear()
    query, key, value = operands()

    @jax.jit
    def step(query, key, value):
        return backend.causal_attention(
            query, key, value, mask(), 0.3, window=3
        )

    got = step(query, key, value)
    assert attention._compiles.cache_info().misses == 1
    assert windows[-1] == (2, 0)  # the step's call, after the check's
    want = keras_s(query, key, value, 3)
    np.testing.assert_allclose(numpy(got), numpy(want), rtol=1e-6)
    attention._compiles.cache_clear()
