"""kmp.callbacks.OrbaxCheckpoint: Keras's Orbax checkpoints, a resumed
run's saves numbered past the ones on disk after a loss scaler skipped
steps; and a kmp run restored from them exactly, on each backend."""

import keras
import numpy as np
from orbax_runs import compiled_model
from orbax_runs import fit
from orbax_runs import steps
from util import tf_only

import kmp
from kmp.callbacks.orbax_checkpoint import skipped_steps


def test_a_resumed_run_s_saves_follow_the_ones_on_disk(tmp_path):
    # Keras's numbers a resumed run from `iterations`, which a scaler does
    # not advance on a skipped step: its saves fell below the ones on
    # disk and were never written (JAX), or the run failed on its first
    # ("Step 6 already exists", TensorFlow and torch).
    kmp.enable("mixed_float16")
    directory = str(tmp_path / "ckpt")
    model = compiled_model()
    fit(model, 10, directory)
    assert steps(directory) == [6, 8, 10]
    skipped = skipped_steps(model)
    assert skipped > 0
    assert int(model.optimizer.iterations) + skipped == 10
    restored = keras.saving.load_model(directory)
    assert skipped_steps(restored) == skipped
    fit(restored, 6, directory)
    assert steps(directory) == [12, 14, 16]


def test_a_run_restored_from_its_checkpoint_goes_on_as_the_run_did(
    tmp_path,
):
    # Weights, Adam's moments, the loss scale and its counters: the
    # restored model's next steps are the run's own, bit for bit
    # (TensorFlow's moments came back zero before kmp's scaler built
    # outside its name scope; `loss_scale_optimizer_test`).
    kmp.enable("mixed_float16")
    directory = str(tmp_path / "ckpt")
    model = compiled_model()
    fit(model, 10, directory)
    restored = keras.saving.load_model(directory)
    for a, b in zip(restored.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b)
        )
    went_on = fit(model, 6, str(tmp_path / "a")).history["loss"]
    resumed = fit(restored, 6, str(tmp_path / "b")).history["loss"]
    assert went_on == resumed


def test_the_count_is_keras_s_without_kmp_s_scaler():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert skipped_steps(model) == 0  # not compiled
    model.compile(optimizer="adam", loss="mse")
    assert skipped_steps(model) == 0
    model.compile(optimizer=kmp.wrap("adam", state_dtype="bfloat16"))
    model.optimizer.build(model.trainable_variables)
    assert skipped_steps(model) == 0  # built, none skipped


def test_save_best_only_at_a_save_freq_in_batches(tmp_path):
    # Keras's compared with its monitor's comparison unset at the first
    # save: "'NoneType' object is not callable" (a reviewer).
    kmp.enable("mixed_float16")
    directory = str(tmp_path / "ckpt")
    x, y = np.ones((64, 16), "float32"), np.zeros(64, "int32")
    checkpoint = kmp.callbacks.OrbaxCheckpoint(
        directory,
        save_freq=2,
        save_best_only=True,
        monitor="loss",
        save_on_background=False,
    )
    compiled_model().fit(
        x, y, batch_size=16, shuffle=False, verbose=0, callbacks=[checkpoint]
    )
    assert steps(directory)


@tf_only
def test_a_run_under_mirrored_strategy_is_numbered(tmp_path):
    # Keras's `set_model` took `int()` of a MirroredVariable and `fit`
    # failed before its first step (a reviewer; one device here).
    import tensorflow as tf

    kmp.enable("mixed_float16")
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        model = compiled_model()
    directory = str(tmp_path / "ckpt")
    fit(model, 4, directory)
    assert steps(directory) == [2, 4]
    checkpoint = kmp.callbacks.OrbaxCheckpoint(directory)
    checkpoint.set_model(model)
    assert checkpoint._total_batches_seen == 4


def test_a_fit_resumed_without_initial_epoch_saves_after_the_steps_on_disk(
    tmp_path,
):
    # Epoch saves are numbered by the epoch, and a resumed fit counts
    # from 0 again: Keras's failed at its first save ("Step 0 already
    # exists", every backend). With `initial_epoch`, Keras's numbers.
    kmp.enable("mixed_float16")
    directory = str(tmp_path / "ckpt")
    x, y = np.ones((32, 16), "float32"), np.zeros(32, "int32")

    def fit_epochs(model, epochs, initial_epoch=0):
        checkpoint = kmp.callbacks.OrbaxCheckpoint(
            directory, max_to_keep=10, save_on_background=False
        )
        model.fit(
            x,
            y,
            batch_size=16,
            epochs=epochs,
            initial_epoch=initial_epoch,
            verbose=0,
            callbacks=[checkpoint],
        )

    fit_epochs(compiled_model(), 2)
    assert steps(directory) == [0, 1]
    fit_epochs(keras.saving.load_model(directory), 2)
    assert steps(directory) == [0, 1, 2, 3]
    fit_epochs(keras.saving.load_model(directory), 6, initial_epoch=4)
    assert steps(directory) == [0, 1, 2, 3, 4, 5]
