"""One training run of an example (`kmp.app.run`): what `Run` does
around the data, the model and `fit`, on a model of the test's own, and
what `train_example` prints."""

import dataclasses
import json
import re
import threading
import warnings

import keras
import numpy as np
import pytest

import kmp
from kmp.app import data
from kmp.app import run as run_module
from kmp.app.run import Run
from kmp_config import configs


@dataclasses.dataclass
class Config(configs.RunConfig):
    pass


def _splits(n=64, features=8):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, features)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    return data.Splits((x, y), (x[:16], y[:16]), "synthetic", "generated")


def _model():
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(2, activation="softmax", dtype="float32"),
        ]
    )
    model.compile(
        optimizer=kmp.wrap(keras.optimizers.SGD(0.1)),
        loss="sparse_categorical_crossentropy",
        weighted_metrics=[
            keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        ],
    )
    return model


def _train(config, name="tiny", more=None):
    """A whole run as an example's `train` writes it."""
    with Run(config, name=name) as run:
        kmp.enable(config.policy)
        splits = _splits()
        steps = run.start(splits)
        assert steps == 4  # 64 examples, batches of 16
        with run.scope():
            model = _model()
        fed = run.data(splits.train, splits.test)
        assert fed["batch_size"] == 16 and len(fed["y"]) == 64
        history = run.distribute(model).fit(
            **fed, epochs=config.epochs, callbacks=run.callbacks, verbose=0
        )
        return run.finish(model, history, "mlp", more=more)


def _config(tmp_path, **changes):
    return Config(
        policy="mixed_float16",
        epochs=2,
        batch_size=16,
        output_dir=str(tmp_path),
        verbose=0,
        compile_cache="off",
        **changes,
    )


def test_a_run_fits_writes_the_record_and_restores_the_policy(tmp_path):
    before = keras.config.dtype_policy().name
    results = _train(
        _config(tmp_path), more=lambda r: {"twice": 2 * r["epochs"]}
    )
    assert keras.config.dtype_policy().name == before
    # kmp knows: the caller's next kmp.wrap does not warn of a reset.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kmp.wrap("sgd")
    assert results["policy"] == "mixed_float16" and results["epochs"] == 2
    assert results["loss_scale"] == 32768.0
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["model"] == "mlp" and record["data"] == "synthetic"
    assert record["twice"] == 4  # `more`, written with the rest
    # Where it came from, as a benchmark's record says it.
    assert re.fullmatch(r"20\d\d-\d\d-\d\dT[\d:]+\+00:00", record["date"])
    assert record["versions"]["keras"] == keras.__version__
    assert record["hardware"]["devices"]
    assert (tmp_path / "tiny.keras").exists()
    assert (tmp_path / "results.png").exists()
    assert not (tmp_path / "backup").exists()  # done, once they are written


class Killed(Exception):
    pass


def test_a_run_killed_as_it_writes_its_files_resumes_and_writes_them(
    tmp_path, monkeypatch
):
    # The backup outlives `fit` until the model and record are written:
    # killed while the model is saved, the run resumes with no epoch left
    # to train (where Keras would have deleted the backup: a rerun would
    # train again from scratch).
    def killed_saving(model, filepath, *args, **kwargs):
        raise Killed

    with monkeypatch.context() as patched:
        patched.setattr(keras.Model, "save", killed_saving)
        with pytest.raises(Killed):
            _train(_config(tmp_path))
    assert (tmp_path / "backup" / "latest.weights.h5").exists()
    results = _train(_config(tmp_path))
    assert results["epochs"] == 2
    assert len(results["history"]["loss"]) == 2  # both, from the backup
    assert (tmp_path / "tiny.keras").exists()
    assert not (tmp_path / "backup").exists()


def test_a_run_s_callbacks_let_keras_run_ahead(tmp_path):
    # Every callback of a run (monitor, step log, progress bar, the
    # backup's) is async-safe for training: on JAX and torch Keras reads
    # batch ends on its threads and does not wait for each step's logs
    # (benchmarks/fit_overlap.py); TensorFlow's Keras always waits.
    class Where(keras.callbacks.Callback):
        async_safe = True
        main = set()

        def on_train_batch_end(self, batch, logs=None):
            self.main.add(threading.current_thread() is threading.main_thread())

    config = dataclasses.replace(_config(tmp_path), verbose=1)
    with Run(config, name="tiny") as run:
        kmp.enable(config.policy)
        splits = _splits()
        steps = run.start(splits)
        model = _model()
        model.fit(
            **run.data(splits.train, splits.test),
            epochs=1,
            steps_per_epoch=steps,
            callbacks=[*run.callbacks, Where()],
            verbose=1,
        )
        assert len(run.steps.times) == len(run.steps.losses) == steps
    assert Where.main == {keras.backend.backend() == "tensorflow"}


def test_what_a_run_refuses_and_when():
    with pytest.raises(kmp.InputError, match="policy must be one of"):
        Run(Config(policy="float16"), name="tiny")
    with pytest.raises(TypeError, match="no example's config"):
        Run(Config())
    assert Run(configs.ImdbConfig()).name == "imdb"
    with Run(Config(compile_cache="off"), name="tiny") as run:
        with pytest.raises(RuntimeError, match="start"):
            run.data(None, None)


@pytest.mark.backend_independent
def test_the_summary_reads_test_accuracy_beside_the_training_loss():
    results = {
        "data": "synthetic",
        "policy": "mixed_float16",
        "replicas": 1,
        "epochs": 1,
        "accuracy": 0.1,
        "final_loss": float("nan"),
        "examples_per_s": 10.0,
        "loss_scale": 1.0,
        "skipped_steps": 100.0,
        "stopped": "kmp: 100 steps in a row had non-finite gradients",
    }
    lines = run_module.summary("cifar10", results).splitlines()
    assert "test accuracy 0.1000, final training loss nan" in lines[0]
    assert lines[0].endswith("skipped steps 100")
    assert lines[1] == results["stopped"]
    results["stopped"] = None
    assert len(run_module.summary("cifar10", results).splitlines()) == 1


@pytest.mark.backend_independent
def test_train_example_records_the_search_once_and_says_where_files_went(
    tmp_path, monkeypatch, capsys
):
    # What happened before `train` (the batch search) goes into the one
    # results.json that the run writes, not into a second write.
    config = configs.ImdbConfig(output_dir=str(tmp_path), compile_cache="off")
    search = {"batch_size": 24}
    monkeypatch.setattr(
        run_module.startup,
        "prepare",
        lambda example, config, given: (config, search),
    )
    monkeypatch.setattr(run_module.report, "show", lambda *a, **k: None)
    written = []

    class Example:
        @staticmethod
        def train(config):
            record = {"test": 1, **(run_module._BEFORE_TRAINING.get() or {})}
            written.append(record)
            return {
                **record,
                "peak_memory_note": "",
                "data": "synthetic",
                "policy": "float32",
                "replicas": 1,
                "epochs": 1,
                "accuracy": 0.5,
                "final_loss": 0.7,
                "examples_per_s": 1.0,
                "loss_scale": None,
                "skipped_steps": 0,
            }

    run_module.train_example(Example, config)
    assert written == [{"test": 1, "batch_search": search}]
    assert run_module._BEFORE_TRAINING.get() is None  # this run's only
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3:] == [
        f"wrote {tmp_path}/imdb.keras (the trained model: kmp.load_model "
        "reads it)",
        f"wrote {tmp_path}/results.json (figures, History, per-step "
        "losses, config)",
        f"wrote {tmp_path}/results.png (loss and loss scale over steps)",
    ]
