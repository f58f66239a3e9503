"""Test harness: TF32 off; the global dtype policy and Keras distribution
restored after each test.

The suite runs once per backend: `KERAS_BACKEND=tensorflow` (everything)
and `KERAS_BACKEND=jax` (everything not marked TensorFlow-only).
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from kmp import backend  # noqa: E402

# Correctness tests compare float32 results exactly; TF32 would round them.
backend.disable_tf32()

# Keras ops are slow to trace; hypothesis's default 200 ms deadline would
# flag compilation, not wrong answers.
settings.register_profile("kmp", deadline=None, max_examples=25)
settings.load_profile("kmp")


def pytest_report_header(config):
    return f"keras {keras.__version__}, backend: {backend.name()}"


@pytest.fixture(autouse=True)
def _restore_global_state():
    previous = keras.config.dtype_policy()
    yield
    keras.config.set_dtype_policy(previous)
    keras.distribution.set_distribution(None)
    keras.utils.clear_session()
