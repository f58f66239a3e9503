"""A resumed run trains as the uninterrupted one did, to the bit: the
data of epoch k is a function of (seed, k) on every feed
(`kmp.app.feeding`: `tf.data` on TensorFlow and torch, the device feed
on JAX) and starts at the resumed epoch; the backup restores the random
draws' state (Dropout's seed generator, and on torch the global
generator an unseeded Dropout draws from) with the weights
(`kmp.app.backup`).

The CIFAR-10 example's own data functions (shuffle, crop, flip) feed a
small model with Dropout, in float32; a run interrupted after epoch 2 of
3 and rerun ends with the losses and weights of one that was not."""

import keras
import numpy as np
import pytest

from kmp.app import backup as kmp_backup
from kmp.app.feeding import Feeding
from kmp.examples import cifar10


class Interrupted(Exception):
    pass


def _config(tmp_path, steps):
    # 40 training images: 5 batches of 8 a pass. With --steps=3 an epoch
    # ends inside a pass, so the rerun starts mid-pass (batch 6 = pass 1,
    # batch 1); without, an epoch is a pass.
    return cifar10.Config(
        data="synthetic",
        synthetic_size=40,
        batch_size=8,
        steps=steps,
        epochs=3,
        seed=3,
        output_dir=str(tmp_path),
        verbose=0,
    )


def _model():
    keras.utils.set_random_seed(7)
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(4, 3, strides=4),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.5),  # random draws the backup restores
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss="sparse_categorical_crossentropy",
    )
    return model


def _run(config, interrupt_after=None):
    """One `kmp train`-like run: the example's data, the backup, `fit`
    with an epoch's steps. Returns every epoch's logs and the weights."""
    keras.utils.set_random_seed(config.seed)  # as `kmp.app.run.Run` does
    splits = cifar10.load_data(config)
    train, _ = cifar10.make_datasets(splits, config)
    backup = kmp_backup.Backup(config, "float32", kmp_backup.directory(config))
    callbacks = list(backup.callbacks)
    if interrupt_after:

        def stop(epoch, logs):
            if epoch + 1 == interrupt_after:
                raise Interrupted  # after the epoch's backup, as a kill

        callbacks.append(keras.callbacks.LambdaCallback(on_epoch_end=stop))
    model = _model()
    history = model.fit(
        train,
        epochs=config.epochs,
        steps_per_epoch=Feeding(config, splits).steps,
        shuffle=False,  # the feed shuffles (as `kmp.app.run.Run` passes)
        callbacks=callbacks,
        verbose=0,
    )
    return backup.history(history), model.get_weights()


@pytest.mark.parametrize("steps", [3, 0], ids=["steps", "passes"])
def test_an_interrupted_run_resumed_equals_an_uninterrupted_one(
    tmp_path, steps
):
    whole_logs, whole_weights = _run(_config(tmp_path / "whole", steps))

    config = _config(tmp_path / "parts", steps)
    with pytest.raises(Interrupted):
        _run(config, interrupt_after=2)
    assert kmp_backup.resumed_epoch(config) == 2
    logs, weights = _run(config)

    assert logs["loss"] == whole_logs["loss"]  # each epoch's, exactly
    for resumed, whole in zip(weights, whole_weights, strict=True):
        np.testing.assert_array_equal(resumed, whole)


@pytest.mark.slow
def test_the_language_model_resumed_equals_its_uninterrupted_run(
    tmp_path, monkeypatch
):
    # The whole example (`kmp train lm`), its Dropout included: 31
    # sequences make 7 batches a pass, so the rerun of epoch 3 (batches
    # 6 to 8) starts inside the first pass and ends in the second. In
    # the memory modes: bfloat16 weights and slots rounded stochastically
    # (the draws keyed by the step), decoder blocks recomputed; the rerun
    # resumes the backup in the same modes.
    pytest.importorskip("keras_hub")
    from util import Interrupted
    from util import interrupt_runs

    import kmp
    from kmp.examples import lm

    settings = dict(
        epochs=3,
        steps=3,
        batch_size=4,
        hidden_dim=16,
        heads=2,
        layers=1,
        sequence_length=32,
        text_bytes=1000,
        verbose=0,
        master_weights="bfloat16",
        optimizer_states="bfloat16",
        remat=True,
    )
    whole = lm.train(lm.Config(output_dir=str(tmp_path / "whole"), **settings))
    config = lm.Config(output_dir=str(tmp_path / "parts"), **settings)
    with monkeypatch.context() as patch:
        interrupt_runs(patch, after_epochs=2)
        with pytest.raises(Interrupted):
            lm.train(config)
    resumed = lm.train(config)
    assert resumed["step_losses"] == whole["step_losses"]  # all 9, exactly
    assert resumed["history"]["val_loss"] == whole["history"]["val_loss"]
    assert resumed["state_bytes"] == whole["state_bytes"]
    model = kmp.load_model(str(tmp_path / "parts" / "lm.keras"))
    assert int(model.optimizer.iterations) == 9
    assert {str(v.dtype) for v in model.trainable_weights} == {"bfloat16"}
    assert kmp.memory.rounding_of(model.optimizer) == "stochastic"
