"""Builds the models of tests/backend/initialization_test.py in a fresh
process, as Keras does or inside `kmp.backend.initialized_together`, and
saves every weight and optimizer slot.

    python tests/initial_values.py MODE OUT.npz [MODE OUT.npz]

(MODE: keras or together.)

The first in a fresh process: what `kmp train` starts from must equal what
stock Keras gives in a process of its own. A second pair is built after
the first in the same process (the test's second run, which must equal a
fresh process's to the bit: one process start less).
"""

import os
import sys

os.environ["KERAS_BACKEND"] = "jax"

import keras  # noqa: E402
import numpy as np  # noqa: E402

from kmp import backend  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "backend"))
from initialization_test import BUILDERS  # noqa: E402


def main(mode, out):
    arrays = {}
    for name, build in sorted(BUILDERS.items()):
        keras.utils.set_random_seed(0)
        optimizer = keras.optimizers.Adam()
        if mode == "together":
            with backend.initialized_together():
                model = build()
            with backend.initialized_together():
                optimizer.build(model.trainable_variables)
        else:
            model = build()
            optimizer.build(model.trainable_variables)
        for i, variable in enumerate(model.weights + optimizer.variables):
            arrays[f"{name}/{i}/{variable.path}"] = np.asarray(variable)
    np.savez(out, **arrays)


if __name__ == "__main__":
    args = sys.argv[1:]
    for i, (mode, out) in enumerate(zip(args[::2], args[1::2])):
        if i:
            # The next run's layers get the names a fresh process gives.
            keras.utils.clear_session()
        main(mode, out)
