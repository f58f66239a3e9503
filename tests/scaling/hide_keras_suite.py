"""A pytest plugin for keras_suite_test.py's own test: Keras's test
module cannot be imported (as in a wheel without its tests), and with
`KMP_TEST_KERAS_VERSION` set Keras reports that version."""

import importlib.abc
import os
import sys

SUITE = "keras.src.optimizers.loss_scale_optimizer_test"


class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == SUITE:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def pytest_configure(config):
    sys.meta_path.insert(0, _Hide())
    if os.environ.get("KMP_TEST_KERAS_VERSION"):
        import keras

        keras.__version__ = os.environ["KMP_TEST_KERAS_VERSION"]
