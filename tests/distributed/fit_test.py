"""kmp.distribute in one process. The multi-worker runs are in
tests/distributed/multi_worker_test.py (they need several processes)."""

import keras
import numpy as np
import pytest
from util import classification_data
from util import mlp
from util import not_tf
from util import run_script
from util import tf_only

import kmp
from kmp import backend
from kmp.distributed import fit

# What each other backend's user is told to use instead.
INSTEAD = {
    "jax": "keras.distribution.DataParallel",
    "torch": "torch.nn.parallel.DistributedDataParallel",
}


@not_tf
def test_distribute_needs_the_tensorflow_backend():
    with pytest.raises(ValueError, match="KERAS_BACKEND=tensorflow") as error:
        kmp.distribute(mlp())
    assert INSTEAD[backend.name()] in str(error.value)
    assert "\n" not in str(error.value)


@tf_only
def test_a_model_built_outside_a_strategy_scope_is_refused():
    with pytest.raises(ValueError, match="inside `with strategy.scope"):
        kmp.distribute(mlp())


@tf_only
def test_not_a_model_is_a_type_error():
    with pytest.raises(TypeError, match="takes a keras.Model, got str"):
        kmp.distribute("model")


@tf_only
def test_fit_evaluate_predict_under_a_one_device_strategy():
    # In a process of its own (tests/one_device_strategy.py says why).
    out = run_script("one_device_strategy.py")
    assert out["returned_the_model"]
    assert out["idempotent"]  # a second kmp.distribute keeps its fit
    assert out["losses"][1] < out["losses"][0]
    assert out["predictions_shape"] == [256, 2]
    # evaluate's loss is the mean crossentropy of predict's outputs.
    assert out["evaluated"] == pytest.approx(out["expected"], rel=1e-3)


@tf_only
@pytest.mark.parametrize(
    "make, batch_size, expected",
    [
        (lambda tf: tf.data.Dataset.range(10).batch(4), None, 4),
        (
            lambda tf: (
                tf.data.Dataset.range(10).batch(6).map(lambda t: t).prefetch(1)
            ),
            None,
            6,
        ),
        (lambda tf: tf.data.Dataset.range(10), None, None),
    ],
)
def test_dataset_batch_size_is_read_through_later_ops(
    make, batch_size, expected
):
    import tensorflow as tf

    assert fit._dataset_batch_size(make(tf)) == expected


@tf_only
def test_batch_size_not_divisible_by_replicas_is_an_error():
    import tensorflow as tf

    check = fit._check_batch_size
    x = np.zeros((8, 2))
    with pytest.raises(
        ValueError, match="batch_size is 6.*over 4 replicas.*e.g. 4"
    ):
        check(x, 6, 4)
    with pytest.raises(ValueError, match="dataset's batch size is 3"):
        check(tf.data.Dataset.range(9).batch(3), None, 2)
    with pytest.raises(ValueError, match="batch_size is 32, .*over 3"):
        check(x, None, 3)  # Keras's default batch size
    check(x, 8, 4)
    check(x, 7, 1)
    check(tf.data.Dataset.range(9), None, 2)  # unbatched: cannot tell
    check(iter([]), None, 2)  # a generator batches itself


@tf_only
def test_non_chief_workers_do_not_write_checkpoints(monkeypatch, tmp_path):
    monkeypatch.setenv(
        "TF_CONFIG",
        '{"cluster": {"worker": ["h:1", "h:2"]}, '
        '"task": {"type": "worker", "index": 1}}',
    )
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"))
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "b"))
    # kmp's backup, half of one in its (shared) directory: the chief
    # settles it, not this worker.
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "training_metadata.json").write_text('{"epoch": 1}')
    kmp_backup = kmp.callbacks.BackupAndRestore(str(shared))
    other = keras.callbacks.History()
    with fit._chief_writes_only([checkpoint, backup, kmp_backup, other]):
        assert checkpoint._save_model(0, None, {}) is None
        backup._save_model()
        backup.on_train_end()
        kmp_backup._settle()
        assert "_save_model" not in vars(other)
    assert list(tmp_path.iterdir()) == [shared]
    assert [p.name for p in shared.iterdir()] == ["training_metadata.json"]
    # Afterwards the callbacks are their own again.
    assert "_save_model" not in vars(checkpoint)
    assert "on_train_end" not in vars(backup)
    assert "_settle" not in vars(kmp_backup)
    kmp_backup._settle()  # as the chief would: half a backup is none
    assert list(shared.iterdir()) == []


@tf_only
@pytest.mark.parametrize("built", [False, True])
def test_keras_s_own_scaler_becomes_kmp_s_with_its_state(built, caplog):
    import tensorflow as tf

    kmp.enable("mixed_float16")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = mlp()
        # Keras wraps "sgd" in its own LossScaleOptimizer.
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    stock = model.optimizer
    assert type(stock) is keras.optimizers.LossScaleOptimizer
    x, y = classification_data()
    if built:
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
        scale = float(stock.dynamic_scale.numpy())
        steps = int(stock.iterations.numpy())
    with caplog.at_level("WARNING", logger="kmp"):
        kmp.distribute(model)
    assert model.optimizer is stock and type(stock) is kmp.LossScaleOptimizer
    assert "now kmp.LossScaleOptimizer" in caplog.text
    if built:
        assert float(stock.loss_scale.numpy()) == scale
        assert int(stock.iterations.numpy()) == steps
    history = model.fit(
        x,
        y,
        batch_size=32,
        epochs=2,
        verbose=0,
        callbacks=[kmp.callbacks.LossScaleMonitor()],
    )
    assert "skipped_steps" in history.history  # kmp's scaler trained
    assert int(stock.iterations.numpy()) == 16 + (8 if built else 0)


@tf_only
def test_a_subclass_of_keras_s_scaler_is_refused():
    import tensorflow as tf

    class Custom(keras.optimizers.LossScaleOptimizer):
        pass

    kmp.enable("mixed_float16")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = mlp()
        model.compile(
            optimizer=Custom(keras.optimizers.SGD()),
            loss="sparse_categorical_crossentropy",
        )
    with pytest.raises(ValueError, match="optimizer=kmp.wrap"):
        kmp.distribute(model)
