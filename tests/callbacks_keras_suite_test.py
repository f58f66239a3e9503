"""Keras's own `BackupAndRestore` test suite, run against kmp's class
(`kmp.callbacks.BackupAndRestore`): everything but how it writes is
Keras's, and must pass what Keras asks of its own.

A file of its own, as `tests/scaling/keras_suite_test.py` is: a Keras
without its tests skips this file only (`util.keras_own_tests`).
"""

from unittest import mock

import pytest
from util import keras_own_tests

import kmp

stock_tests = keras_own_tests("keras.src.callbacks.backup_and_restore_test")

# The callback is the same on every backend: its files are h5 and JSON.
pytestmark = pytest.mark.backend_independent("torch")


class TestStockKerasBehaviour(stock_tests.BackupAndRestoreCallbackTest):
    """Keras's own BackupAndRestore tests, run against kmp's class: the
    suite's `callbacks.BackupAndRestore` is kmp's while each runs."""

    def setUp(self):
        super().setUp()
        patcher = mock.patch.object(
            stock_tests.callbacks,
            "BackupAndRestore",
            kmp.callbacks.BackupAndRestore,
        )
        patcher.start()
        self.addCleanup(patcher.stop)
