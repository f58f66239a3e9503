"""A short mixed-precision fit that shows kmp at work (`kmp demo`).

It trains a small convnet on a generated, learnable image dataset (no
download), with `kmp.enable(policy)`, `kmp.wrap("adam")` and
`kmp.callbacks.LossScaleMonitor()`, and reports the policy, the final loss
scale and the number of skipped steps. The CIFAR-10 trainer in `examples/`
is the full-size version of the same recipe.
"""

import time

import keras
import numpy as np

import kmp

NUM_CLASSES = 4
IMAGE_SHAPE = (16, 16, 3)


def make_data(num_examples: int, seed: int = 0):
    """Images whose class is the quadrant holding a bright blob, plus noise.

    Returns:
        `(x, y)`: float32 images in [0, 1] and int32 labels.
    """
    rng = np.random.default_rng(seed)
    y = rng.integers(0, NUM_CLASSES, size=num_examples).astype("int32")
    x = rng.uniform(0.0, 0.3, size=(num_examples, *IMAGE_SHAPE))
    half = IMAGE_SHAPE[0] // 2
    for quadrant in range(NUM_CLASSES):
        rows = slice(0, half) if quadrant < 2 else slice(half, None)
        cols = slice(0, half) if quadrant % 2 == 0 else slice(half, None)
        x[y == quadrant, rows, cols, :] += 0.7
    return x.astype("float32"), y


def build_model() -> keras.Model:
    """A 2-conv classifier; its softmax output is float32 (KerasHub idiom
    (a): the layer that produces the model output gets `dtype="float32"`).
    """
    return keras.Sequential(
        [
            keras.Input(IMAGE_SHAPE),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(NUM_CLASSES),
            keras.layers.Activation("softmax", dtype="float32"),
        ],
        name="kmp_demo",
    )


def run(
    policy: str = "mixed_float16",
    epochs: int = 2,
    steps_per_epoch: int = 20,
    batch_size: int = 64,
    initial_scale: float = 2.0**15,
    seed: int = 0,
    verbose: int = 2,
) -> dict:
    """Trains the demo model and returns a summary dict.

    The global dtype policy is restored afterwards.

    Returns:
        A dict with `policy`, `optimizer`, `loss`, `accuracy`,
        `loss_scale` (`None` without scaling), `skipped_steps`,
        `examples_per_second` and the per-epoch `history`.
    """
    keras.utils.set_random_seed(seed)
    x, y = make_data(steps_per_epoch * batch_size, seed)
    with kmp.policy_scope(policy) as active:
        model = build_model()
        optimizer = kmp.wrap(
            keras.optimizers.Adam(3e-3), initial_scale=initial_scale
        )
        model.compile(
            optimizer=optimizer,
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        start = time.perf_counter()
        history = model.fit(
            x,
            y,
            epochs=epochs,
            batch_size=batch_size,
            callbacks=[kmp.callbacks.LossScaleMonitor()],
            verbose=verbose,
        )
        seconds = time.perf_counter() - start
    scaled = isinstance(optimizer, kmp.LossScaleOptimizer)
    return {
        "policy": active.name,
        "optimizer": type(optimizer).__name__,
        "loss": history.history["loss"][-1],
        "accuracy": history.history["accuracy"][-1],
        "loss_scale": float(optimizer.loss_scale) if scaled else None,
        "skipped_steps": int(optimizer.skipped_steps) if scaled else 0,
        "examples_per_second": epochs * len(x) / seconds,
        "history": history.history,
    }
