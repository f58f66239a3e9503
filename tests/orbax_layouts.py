"""keras-io's Orbax guide ("Orbax Checkpointing in Keras"), its model
parallel and cross-layout sections, under kmp, on 4 virtual CPU devices.

    python tests/orbax_layouts.py DIRECTORY

A subclassed model (Keras's own load gives it back its initial weights,
defect 43), pinned, trained under kmp's scaler with its kernels split
over a 2 x 2 mesh, checkpointed by `kmp.callbacks.OrbaxCheckpoint`, then
loaded by `kmp.load_model` under a layout that splits one kernel only.
The guide's second layer is 2 wide, not 1: a kernel of one column does
not split in 2 (JAX's IndivisibleError, with Keras's load as with
kmp's). Prints one JSON line (prefix RESULT). A helper for
tests/saving/checkpoint_dirs_test.py: the device count must be set
before JAX initialises, so it runs in its own process.
"""

import json
import os
import sys
import warnings

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=4"
).strip()
os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kmp  # noqa: E402


@keras.saving.register_keras_serializable("kmp_tests")
class Regressor(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(64, activation="relu", name="dense_1")
        self.head = keras.layers.Dense(2, name="dense_2")

    def call(self, x):
        return self.head(self.hidden(x))


def _split(mesh, *paths):
    """Keras's `ModelParallel` with the kernels at `paths` split in
    columns over the mesh's "model" axis."""
    layout_map = keras.distribution.LayoutMap(mesh)
    for path in paths:
        layout_map[path] = (None, "model")
    return keras.distribution.ModelParallel(
        layout_map=layout_map, batch_dim_name="data"
    )


def _numpy(variables):
    return [np.asarray(v.value).astype("float32") for v in variables]


def main(directory):
    kmp.enable("mixed_float16")
    rng = np.random.default_rng(0)
    x = rng.random((256, 32)).astype("float32")
    y = rng.random((256, 2)).astype("float32")
    mesh = keras.distribution.DeviceMesh(
        (2, 2), ["data", "model"], jax.devices()
    )
    keras.distribution.set_distribution(
        _split(mesh, "dense_1/kernel", "dense_2/kernel")
    )
    model = kmp.pin_float32(Regressor())
    model.compile(optimizer=kmp.wrap("adam"), loss="mse")
    model.fit(
        x,
        y,
        batch_size=32,
        epochs=3,
        verbose=0,
        callbacks=[
            kmp.callbacks.OrbaxCheckpoint(
                directory, max_to_keep=2, save_on_background=False
            )
        ],
    )
    keras.distribution.set_distribution(_split(mesh, "dense_2/kernel"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = kmp.load_model(directory)
    said = [str(w.message) for w in caught if "kmp" in str(w.message)]
    stock = keras.saving.load_model(directory)
    result = {
        "said": said,
        "paths": [v.path for v in model.weights],
        # Into how many parts each variable's last axis is split.
        "parts": {
            v.path: v.shape[-1] // v.value.sharding.shard_shape(v.shape)[-1]
            for v in restored.trainable_variables
        },
        "weights_equal": all(
            np.array_equal(a, b)
            for a, b in zip(_numpy(model.weights), _numpy(restored.weights))
        ),
        "stock_weights_equal": all(
            np.array_equal(a, b)
            for a, b in zip(_numpy(model.weights), _numpy(stock.weights))
        ),
        "optimizer_equal": all(
            np.array_equal(a, b)
            for a, b in zip(
                _numpy(model.optimizer.variables),
                _numpy(restored.optimizer.variables),
            )
        ),
        "prediction_gap": float(
            np.max(
                np.abs(
                    model.predict(x[:8], verbose=0)
                    - restored.predict(x[:8], verbose=0)
                )
            )
        ),
        "loss_scale": float(restored.optimizer.dynamic_scale),
    }
    keras.distribution.set_distribution(None)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
