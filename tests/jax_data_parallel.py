"""kmp's scaler under keras.distribution.DataParallel on 2 host CPUs.

    python tests/jax_data_parallel.py

Prints one JSON line (prefix RESULT). A helper for
tests/replicas_test.py: the device count must be set before JAX
initialises, so it runs in its own process.
"""

import json
import os

# Added to the suite's flags (conftest: a cheaper LLVM pipeline), not
# in their place.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=2"
).strip()
os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from util import classification_data  # noqa: E402
from util import mlp  # noqa: E402

import kmp  # noqa: E402


def replicas_agree(variable):
    shards = [np.asarray(s.data) for s in variable.value.addressable_shards]
    return len(shards) == 2 and all(
        np.array_equal(shards[0], s) for s in shards
    )


def main():
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=jax.devices())
    )
    kmp.enable("mixed_float16")
    model = mlp()
    optimizer = kmp.wrap(keras.optimizers.SGD(0.1), initial_scale=2.0**10)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    x, y = classification_data()

    # One batch of 8: rows 4-7 land on device 1 and exceed float16's range
    # (65504), so only that device's gradient contribution is non-finite.
    bad = x[:8].copy()
    bad[4:] = 7e4
    before = [w.numpy().copy() for w in model.weights]
    model.fit(bad, y[:8], batch_size=8, verbose=0, shuffle=False)
    unchanged = all(
        np.array_equal(a, w.numpy()) for a, w in zip(before, model.weights)
    )
    after_bad = {
        "weights_unchanged": unchanged,
        "scale": float(optimizer.loss_scale),
        "skipped": int(optimizer.skipped_steps),
    }
    history = model.fit(x, y, batch_size=8, epochs=3, verbose=0)
    print(
        "RESULT "
        + json.dumps(
            {
                "devices": len(jax.devices()),
                "after_bad": after_bad,
                "loss": history.history["loss"],
                "skipped": int(optimizer.skipped_steps),
                "replicas_agree": all(
                    replicas_agree(v)
                    for v in model.weights + optimizer.variables
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
