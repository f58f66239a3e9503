"""One run of an example (`kmp.app.session.Session`): what it does
around the data, the model and `fit`, on a model of the test's own."""

import dataclasses
import json

import keras
import numpy as np
import pytest

import kmp
from kmp.app import data
from kmp.app.session import Session
from kmp_config import configs


@dataclasses.dataclass
class Config(configs.RunConfig):
    pass


def _splits(n=64, features=8):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, features)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    return data.Splits((x, y), (x[:16], y[:16]), "synthetic", "generated")


def _model(steps):
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


def test_a_session_runs_fit_and_writes_the_record(tmp_path):
    config = Config(
        policy="mixed_float16",
        epochs=2,
        batch_size=16,
        output_dir=str(tmp_path),
        verbose=0,
        compile_cache="off",
    )
    before = keras.config.dtype_policy().name
    with Session(config, "tiny") as session:
        assert keras.config.dtype_policy().name == "mixed_float16"
        splits = _splits()
        session.start(splits)
        assert session.steps == 4  # 64 examples, batches of 16
        with session.scope():
            model = _model(session.steps)
        model = session.distribute(model)
        feed = session.feed(splits.train)
        assert feed["batch_size"] == 16 and len(feed["y"]) == 64
        history = model.fit(
            **feed,
            validation_data=session.validation(splits.test),
            validation_steps=session.eval_steps,
            epochs=config.epochs,
            callbacks=session.callbacks,
            verbose=0,
        )
        results = session.results(model, history, "mlp")
        session.save(model, results)
    assert keras.config.dtype_policy().name == before
    assert results["policy"] == "mixed_float16" and results["epochs"] == 2
    assert results["loss_scale"] == 32768.0
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["model"] == "mlp" and record["data"] == "synthetic"
    assert (tmp_path / "tiny.keras").exists()
    assert not (tmp_path / "backup").exists()  # done: Keras deletes it


def test_what_a_session_refuses_and_when():
    config = Config(strategy="mirrored")
    with pytest.raises(kmp.InputError, match="runs on one device"):
        Session(config, "lm", strategies=False)
    with pytest.raises(kmp.InputError, match="policy must be one of"):
        Session(Config(policy="float16"), "tiny")
    with Session(Config(compile_cache="off"), "tiny") as session:
        with pytest.raises(RuntimeError, match="start"):
            _ = session.callbacks
