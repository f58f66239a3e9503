"""Keras's own `BackupAndRestore` and `ModelCheckpoint` test suites, run
against kmp's classes (`kmp.callbacks.checkpoints`): everything but how
they write is Keras's, and must pass what Keras asks of its own.

A file of its own, as `tests/scaling/keras_suite_test.py` is: a Keras
without its tests skips this file only (`util.keras_own_tests`).
"""

from unittest import mock

import pytest
from util import keras_own_tests

import kmp

backups = keras_own_tests("keras.src.callbacks.backup_and_restore_test")
checkpoints = keras_own_tests("keras.src.callbacks.model_checkpoint_test")

# The callbacks are the same on every backend: their files are h5, zip
# and JSON.
pytestmark = pytest.mark.backend_independent("torch")


def _with_kmp_s(test, suite, name):
    """While each test runs, the suite's `callbacks.NAME` is kmp's."""
    patcher = mock.patch.object(
        suite.callbacks, name, getattr(kmp.callbacks, name)
    )
    patcher.start()
    test.addCleanup(patcher.stop)


class TestStockBackupAndRestore(backups.BackupAndRestoreCallbackTest):
    def setUp(self):
        super().setUp()
        _with_kmp_s(self, backups, "BackupAndRestore")


class TestStockModelCheckpoint(checkpoints.ModelCheckpointTest):
    def setUp(self):
        super().setUp()
        _with_kmp_s(self, checkpoints, "ModelCheckpoint")
