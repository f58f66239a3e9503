"""Data held on the accelerator, batches cut there: the JAX feed.

On the JAX backend, `fit` fed with host arrays shuffles, slices and
copies every batch from the host: on an H100 the ResNet-9 example trained
at 60k images/s that way, against 96k for the same model in `kmp bench`
(`benchmarks/results/h100_2026-11-22/`). Here the arrays go to the device
once, as they are (CIFAR-10's uint8 images are 150 MB), and one jitted
function cuts each batch there: it gathers the rows by a permutation,
then runs the example's `transform` (normalization, augmentation) on the
device. Every batch is full (a training pass drops its remainder, an
evaluation is padded with zero-weight rows), so the train and test steps
compile once.

TensorFlow keeps its `tf.data` pipelines (they prefetch on the host while
the step runs); this module imports JAX and is used on that backend only.
"""

import math

import keras
import numpy as np

import kmp


def padded_rows(size: int, batch_size: int, steps: int | None = None):
    """Rows and sample weights of an evaluation in full batches.

    The first `steps` batches (all when `None`), padded by repeating rows
    up to a multiple of `batch_size`, so the test step compiles once. The
    real rows weigh `total / real`, the padding 0: Keras's loss divides a
    batch's weighted sum by the batch size and its mean weighs batches by
    their size, so this weight makes the loss the exact mean over the
    real rows; the accuracy, a weighted mean, is exact with any constant.

    Returns:
        `(rows, weights)`: int64 indices into the split and float32
        weights, both of length `steps * batch_size` or the padded size.
    """
    real = size if not steps else min(size, steps * batch_size)
    total = math.ceil(real / batch_size) * batch_size
    rows = np.arange(total) % real
    weights = np.where(np.arange(total) < real, total / real, 0.0)
    return rows, weights.astype("float32")


class DeviceBatches(keras.utils.PyDataset):
    """Full batches of arrays that live on the device, for `fit`.

    Training (`shuffle=True`) draws a new permutation for each pass over
    the data and drops the last partial batch; evaluation
    (`shuffle=False`) pads the split with `padded_rows` and yields
    `(x, y, sample_weight)`. A `transform(x, key)` runs on the device in
    the same jitted function as the gather, `key` a JAX PRNG key of its
    own per batch (for random augmentation); it must keep the shape.

    The batches a run trains on are one stream: batch `b` is batch
    `b % len(self)` of pass `b // len(self)`, whose permutation and keys
    are drawn from (`seed`, pass) alone. A run resumed at epoch `k`
    starts the stream where the uninterrupted run was at epoch `k`
    (`start`), so the two train on the same batches.

    Args:
        x: Inputs, a NumPy array (any dtype; uint8 images stay uint8 on
            the device until `transform` converts them).
        y: Targets.
        batch_size: Rows per batch.
        shuffle: Training order (a permutation per pass) if True, else
            the evaluation order with padding.
        transform: `transform(x, key) -> x`, traced once; `None` passes
            the rows as they are.
        repeat: Endless passes (for `fit(steps_per_epoch=...)`, which may
            ask for more batches than one pass has).
        steps: Evaluation only: use the first `steps` batches.
        seed: The permutations and transform keys derive from it.
        start: The first batch's place in the stream: 0, or on a resumed
            run the epochs done times the batches of an epoch.

    Example:

    ```python
    train = DeviceBatches(x, y, 512, shuffle=True, transform=augment)
    test = DeviceBatches(x_test, y_test, 512)
    model.fit(train, validation_data=test, epochs=8)
    ```
    """

    def __init__(
        self,
        x,
        y,
        batch_size,
        *,
        shuffle=False,
        transform=None,
        repeat=False,
        steps=None,
        seed=0,
        start=0,
    ):
        import jax

        # workers=1 without multiprocessing: Keras calls __getitem__ in
        # its own loop, in order (no enqueuer thread).
        super().__init__(workers=1, use_multiprocessing=False)
        size = len(y)
        if len(x) != size:
            raise kmp.InputError(
                f"x and y must have the same number of rows; got {len(x)} "
                f"and {size}."
            )
        if size < (batch_size if shuffle else 1):
            raise kmp.InputError(
                f"{size} rows do not make one batch of {batch_size}; use a "
                "smaller batch_size."
            )
        self.batch_size, self.shuffle = batch_size, shuffle
        self.transform, self.repeat = transform, repeat
        self._order_key, self._augment_key = jax.random.split(
            jax.random.key(seed)
        )
        self._x, self._y = jax.device_put(x), jax.device_put(y)
        self._weights = None
        if shuffle:
            self._batches = size // batch_size  # the remainder is dropped
            self._order = None
        else:
            rows, weights = padded_rows(size, batch_size, steps)
            self._batches = len(rows) // batch_size
            self._order = jax.device_put(rows)
            self._weights = weights  # sliced on the host, sent with x
        self._start, self._first = start, None
        self._pass = None
        self._cut = jax.jit(self._batch)

    def __len__(self):
        return self._batches

    @property
    def num_batches(self):
        return None if self.repeat else self._batches

    def _batch(self, x, y, order, position, key):
        import jax

        rows = jax.lax.dynamic_slice_in_dim(
            order, position * self.batch_size, self.batch_size
        )
        inputs = x[rows]
        if self.transform is not None:
            inputs = self.transform(inputs, jax.random.fold_in(key, position))
        return inputs, y[rows]

    def _new_pass(self, number):
        """Pass `number`'s order and augmentation keys, drawn from the
        seed and `number` alone. Once per pass, so a batch costs one
        dispatch of the jitted cut."""
        import jax

        self._pass = number
        if self.shuffle:
            key = jax.random.fold_in(self._order_key, number)
            self._order = jax.random.permutation(key, len(self._y))
        self._pass_key = jax.random.fold_in(self._augment_key, number)

    def __getitem__(self, index):
        # The stream's batch at `index`: a repeating dataset's index
        # counts on over epochs; Keras restarts the others at 0 each
        # epoch, which begins the next pass.
        if self._first is None:
            self._first = self._start
        elif index == 0 and not self.repeat:
            self._first += self._batches
        number, position = divmod(self._first + index, self._batches)
        if number != self._pass:
            self._new_pass(number)
        x, y = self._cut(
            self._x, self._y, self._order, position, self._pass_key
        )
        if self._weights is None:
            return x, y
        start = position * self.batch_size
        return x, y, self._weights[start : start + self.batch_size]


def crop_and_flip(padding=4):
    """CIFAR-style augmentation on the device: reflect-pad by `padding`,
    crop back at a random offset per image, flip half the images left to
    right. A `transform` for `DeviceBatches` (NHWC batches)."""

    def transform(images, key):
        import jax
        import jax.numpy as jnp

        n, height, width, channels = images.shape
        padded = jnp.pad(
            images,
            ((0, 0), (padding, padding), (padding, padding), (0, 0)),
            mode="reflect",
        )
        k_y, k_x, k_flip = jax.random.split(key, 3)
        dy = jax.random.randint(k_y, (n,), 0, 2 * padding + 1)
        dx = jax.random.randint(k_x, (n,), 0, 2 * padding + 1)

        def crop(image, y, x):
            return jax.lax.dynamic_slice(
                image, (y, x, 0), (height, width, channels)
            )

        cropped = jax.vmap(crop)(padded, dy, dx)
        flip = jax.random.bernoulli(k_flip, 0.5, (n, 1, 1, 1))
        return jnp.where(flip, cropped[:, :, ::-1], cropped)

    return transform
