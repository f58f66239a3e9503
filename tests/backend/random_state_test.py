"""The framework's global generator, which unseeded Keras draws use on
torch: its state, kept and restored, gives the same draws again."""

import json

import keras
import numpy as np

from kmp import backend


def _draws():
    # Dropout without a seed: on torch, the global generator's draws.
    layer = keras.layers.Dropout(0.5)
    return keras.ops.convert_to_numpy(layer(np.ones((64,)), training=True))


def test_a_restored_state_draws_the_same_again():
    keras.utils.set_random_seed(0)
    state = backend.random_state()
    json.dumps(state)  # the backup's record is JSON
    first = _draws()
    backend.restore_random_state(state)
    again = _draws()
    if keras.backend.backend() == "torch":
        np.testing.assert_array_equal(again, first)
        # Without the restore, the next draws differ.
        assert not np.array_equal(_draws(), first)
    else:
        # Keras's own seed generators: no global state to keep.
        assert state is None


def test_no_state_changes_nothing():
    keras.utils.set_random_seed(0)
    backend.restore_random_state(None)
    backend.restore_random_state([])
    first = _draws()
    keras.utils.set_random_seed(0)
    np.testing.assert_array_equal(_draws(), first)
