"""How an example's splits reach `fit` on this backend: one data helper.

A training run feeds `fit` full batches, so that the train and test
steps compile once: training drops its last partial batch, validation
pads its own with rows of weight 0 (`device_data.padded_rows`). Where the
batches are made depends on the backend, and `Feeding.kind` names the
three ways, so that an example's `make_datasets` branches on one value:

    "device"    JAX without a keras.distribution: the arrays go to the
                device once and each batch is cut (and augmented) there
                (`kmp.app.device_data`)
    "tf.data"   TensorFlow is installed: `tf.data` pipelines prepare
                batches on the host while the step runs
    "arrays"    neither (PyTorch, or JAX under a distribution, without
                TensorFlow): NumPy arrays

Under a keras.distribution Keras shards host batches itself, so the
device feed is for one process's own devices without one.
"""

import keras

from kmp.app import data as kmp_data
from kmp.app import device_data
from kmp.app import recipes


class Feeding:
    """The batches of one run's splits (see the module).

    Args:
        config: The run's config (`kmp_config.configs.RunConfig`): its
            `batch_size`, `steps`, `eval_steps`, `seed`, `distribution`.
        splits: The `kmp.app.data.Splits` trained on.

    Attributes:
        kind: "device", "tf.data" or "arrays".
        eval_steps: Validation batches: `--eval_steps`, the share
            `--steps` is of an epoch, or all (`None`).

    Example:

    ```python
    feeding = Feeding(config, splits)
    if feeding.kind == "device":
        train = feeding.on_device(splits.train, training=True)
        test = feeding.on_device(splits.test)
    ```
    """

    def __init__(self, config, splits):
        self.config = config
        self.eval_steps = recipes.evaluation_steps(config, splits)
        if recipes.feeds_device(config):
            self.kind = "device"
        elif kmp_data.has_tensorflow():
            self.kind = "tf.data"
        else:
            self.kind = "arrays"

    def on_device(self, split, training=False, transform=None):
        """`split` (arrays, or a `tf.data` split read into arrays) held on
        the device, as `fit`'s batches: shuffled each pass and endless
        under `--steps` when `training`, else validation's padded
        batches. `transform(x, key)` runs on the device per batch
        (`kmp.app.device_data.DeviceBatches`)."""
        if self.kind != "device":
            raise ValueError(
                f"on_device() feeds JAX without a distribution; this run "
                f"feeds {self.kind!r} (backend {keras.backend.backend()}, "
                f"--distribution={self.config.distribution}). Branch on "
                "Feeding.kind."
            )
        x, y = kmp_data.as_arrays(split)
        config = self.config
        if training:
            return device_data.DeviceBatches(
                x,
                y,
                config.batch_size,
                shuffle=True,
                transform=transform,
                repeat=bool(config.steps),  # steps * epochs may exceed a pass
                seed=config.seed,
            )
        return device_data.DeviceBatches(
            x, y, config.batch_size, transform=transform, steps=self.eval_steps
        )

    def padded(self, split):
        """Validation in full batches of `(x, y, sample_weight)`, the last
        padded with rows of weight 0 and cut at `eval_steps`: a `tf.data`
        split as a batched dataset, an `(x, y)` pair as three arrays."""
        if isinstance(split, tuple):
            return recipes.padded_arrays(
                split, self.config.batch_size, self.eval_steps
            )
        return recipes.padded_evaluation(
            split, self.config.batch_size, self.eval_steps
        )
