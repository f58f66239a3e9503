"""`kmp.callbacks`: callbacks for a long mixed-precision run: what it
does, seen, and what it did, kept.

    loss_scale_monitor  `LossScaleMonitor` puts the loss scale and the
                        count of skipped steps into the logs of
                        `model.fit` (the progress bar, `History`,
                        `CSVLogger`, TensorBoard), and stops a run that no
                        loss scale can save; `StepCount`
    progress_bar        `ProgressBar`: Keras's progress bar, except that
                        `fit` need not wait for each step's logs to draw it
    checkpoints         `BackupAndRestore` and `ModelCheckpoint`: Keras's,
                        except that a run killed while they write leaves
                        whole files
    orbax_checkpoint    `OrbaxCheckpoint`: Keras's, except that a resumed
                        run's saves are numbered past the ones on disk

Imports from kmp: backend, errors, scaling.
"""

from kmp.callbacks.checkpoints import BackupAndRestore
from kmp.callbacks.checkpoints import ModelCheckpoint
from kmp.callbacks.loss_scale_monitor import LossScaleMonitor
from kmp.callbacks.loss_scale_monitor import StepCount
from kmp.callbacks.orbax_checkpoint import OrbaxCheckpoint
from kmp.callbacks.progress_bar import ProgressBar

__all__ = [
    "BackupAndRestore",
    "LossScaleMonitor",
    "ModelCheckpoint",
    "OrbaxCheckpoint",
    "ProgressBar",
    "StepCount",
]
