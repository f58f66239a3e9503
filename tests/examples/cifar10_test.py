"""examples/cifar10.py (importable as kmp.examples.cifar10), for a few
steps: synthetic data, the real TFDS code path on mock data, strategies,
flags. The 2-worker run is in tests/distributed/multi_worker_test.py."""

import dataclasses
import json
import os

import keras
import numpy as np
import pytest

import kmp
from kmp.app import data
from kmp.app import run
from kmp.examples import cifar10


def small(tmp_path, **overrides):
    settings = dict(
        epochs=1,
        steps=2,
        batch_size=16,
        width=8,
        synthetic_size=64,
        data="synthetic",
        output_dir=str(tmp_path),
        verbose=0,
    )
    settings.update(overrides)
    return cifar10.Config(**settings)


@pytest.mark.slow
def test_trains_on_synthetic_data_with_float16_and_writes_results(tmp_path):
    # On JAX, 30 steps of 32 images: enough to learn the synthetic twin's
    # colour patterns well above chance (0.1); 0.54 on TF and 0.61 on
    # torch measured on 2026-11-28. But TF (no XLA on a CPU, as Keras
    # decides) and eager torch run float16 convolutions on this CPU at
    # some 0.1 GFLOP/s: 2 s a step of 32 width-8 images, 85 s and 54 s
    # for those 30 steps. There the run is 2 x 3 steps and the test
    # checks what it writes; that float16 learns on every backend is
    # tests/memory/mnist_modes_test.py's (real digits, within 0.5 points
    # of float32's accuracy). The whole test split is validated.
    learns = keras.backend.backend() == "jax"
    results = cifar10.train(
        small(
            tmp_path,
            policy="mixed_float16",
            steps=15 if learns else 3,
            epochs=2,
            batch_size=32,
            learning_rate=0.4,
            synthetic_size=384,
        )
    )
    assert results["data"] == "synthetic"
    assert results["policy"] == "mixed_float16"
    # No overflow: the scale stays at its initial 2^15 (growth comes after
    # 2000 finite steps).
    assert results["skipped_steps"] == 0
    assert results["stopped"] is None  # the monitor had no reason to stop
    assert results["loss_scale"] == 32768.0
    if learns:
        assert results["accuracy"] > 0.3
        assert results["history"]["loss"][-1] < results["history"]["loss"][0]
    assert np.isfinite(results["history"]["loss"]).all()
    assert results["examples_per_s"] > 0
    assert {"loss", "val_loss", "loss_scale"} <= set(results["history"])
    assert sorted(os.listdir(tmp_path)) == [
        "cifar10.keras",
        "results.json",
        "results.png",
    ]
    with open(tmp_path / "results.json") as f:
        assert json.load(f)["accuracy"] == results["accuracy"]
    assert "(SYNTHETIC data)" in run.summary("cifar10", results)
    assert results["peak_memory_mib"] > 0
    # float32 masters under mixed_float16: 4 bytes per parameter; SGD
    # with momentum: one float32 slot per trainable weight, and scalars.
    state = results["state_bytes"]
    assert state["weights"] == 4 * results["parameters"]
    assert state["weights"] / 2 < state["optimizer_state"] < state["weights"]
    # The global policy is the caller's again.
    assert keras.config.dtype_policy().name == "float32"


@pytest.mark.backend_independent
def test_model_is_resnet9_with_a_float32_softmax():
    keras.config.set_dtype_policy("mixed_float16")
    model = kmp.pin_float32(cifar10.build_model(width=8))
    output = model(np.zeros((2, 32, 32, 3), "float32"))
    assert keras.backend.standardize_dtype(output.dtype) == "float32"
    convs = [
        layer
        for layer in model.layers
        if isinstance(layer, keras.layers.Conv2D)
    ]
    assert len(convs) == 8
    assert [c.filters for c in convs][:2] == [8, 16]


@pytest.mark.backend_independent
@pytest.mark.slow
def test_real_tfds_code_path_on_mock_data(tmp_path, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    monkeypatch.setattr(data, "_reachable", lambda: True)
    with tfds.testing.mock_data(num_examples=32):
        results = cifar10.train(small(tmp_path, data="tfds"))
    assert results["data"] == "tfds"
    assert results["epochs"] == 1


@pytest.mark.backend_independent
@pytest.mark.slow
def test_auto_data_offline_trains_on_labelled_synthetic_data(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(data, "_reachable", lambda: False)
    results = cifar10.train(
        small(tmp_path, data="auto", data_dir=str(tmp_path / "tfds"))
    )
    assert results["data"] == "synthetic"
    assert "offline" in results["data_note"]


@pytest.mark.slow
def test_mirrored_strategy_on_this_machine(tmp_path):
    if keras.backend.backend() == "torch":
        with pytest.raises(ValueError, match="no multi-device fit"):
            cifar10.train(small(tmp_path, strategy="mirrored"))
        return
    if keras.backend.backend() == "jax":
        # JAX's engine is keras.distribution: --strategy names it.
        with pytest.raises(ValueError, match="--distribution=data"):
            cifar10.train(small(tmp_path, strategy="mirrored"))
        try:
            results = cifar10.train(small(tmp_path, distribution="data"))
        finally:
            keras.distribution.set_distribution(None)
        assert results["replicas"] == 1  # one CPU device here
        return
    results = cifar10.train(small(tmp_path, strategy="mirrored"))
    assert results["replicas"] == 1
    assert results["strategy"] == "mirrored"


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "field, value, message",
    [
        ("epochs", 0, "epochs must be >= 1"),
        ("steps", -1, "steps must be >= 0"),
        ("learning_rate", 0.0, "learning_rate must be > 0"),
        ("strategy", "tpu", "strategy must be one of none, mirrored"),
        ("data", "web", "data must be one of auto, tfds, synthetic"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        cifar10.train(small(tmp_path, **{field: value}))


@pytest.mark.backend_independent
def test_flags_map_onto_the_config():
    from absl import flags as absl_flags

    from kmp_config import flags

    values = absl_flags.FlagValues()
    flags.define_flags(cifar10.Config, values)
    values(["cifar10", "--policy=mixed_bfloat16", "--steps=3", "--width=16"])
    config = flags.config_from_flags(cifar10.Config, values)
    assert config.policy == "mixed_bfloat16"
    assert (config.steps, config.width, config.epochs) == (3, 16, 10)
    with pytest.raises(absl_flags.IllegalFlagValueError):
        values(["cifar10", "--batch_size=0"])


@pytest.mark.slow
def test_an_interrupted_run_resumes_with_its_flags_and_only_with_them(
    tmp_path, monkeypatch, capsys
):
    from util import Interrupted
    from util import fails_in_one_line
    from util import interrupt_runs

    import kmp_cli

    settings = dataclasses.asdict(small(tmp_path, epochs=3))
    argv = ["train", "cifar10", *(f"--{k}={v}" for k, v in settings.items())]
    with monkeypatch.context() as patch:
        interrupt_runs(patch, after_epochs=2)
        with pytest.raises(Interrupted):
            kmp_cli.main(argv)
    with open(tmp_path / "backup" / "run.json") as f:
        before = json.load(f)["epochs"]
    assert len(before["loss"]) == 2

    # Other sizes: refused in one line, before anything is built.
    other = [a.replace("--width=8", "--width=16") for a in argv]
    phrase = "holds the backup of an interrupted run with --width=8"
    assert fails_in_one_line(other, phrase, capsys) == 2

    # The same flags, and more epochs (which may change): it resumes.
    assert kmp_cli.main([*argv, "--epochs=4"]) == 0
    with open(tmp_path / "results.json") as f:
        results = json.load(f)
    assert results["epochs"] == 4
    history = results["history"]
    assert len(history["loss"]) == len(history["val_accuracy"]) == 4
    assert history["loss"][:2] == before["loss"]
    assert not (tmp_path / "backup").exists()


@pytest.mark.slow
# How many validation steps --steps allows, and which figures the results
# take from the history: kmp's own arithmetic, which no backend changes
# (a whole run each, which torch runs in the least time).
@pytest.mark.backend_independent("torch")
def test_steps_bound_validation_and_the_test_figures(tmp_path, monkeypatch):
    seen = {}
    fit = keras.Model.fit

    def spy(self, *args, **kwargs):
        seen["validation_steps"] = kwargs.get("validation_steps")
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "fit", spy)
    # A test split of 51 images: 4 batches of 16, of which --steps=1 runs 1.
    results = cifar10.train(small(tmp_path, steps=1, synthetic_size=256))
    assert seen["validation_steps"] == 1
    assert results["accuracy"] == results["history"]["val_accuracy"][-1]
    assert results["test_loss"] == results["history"]["val_loss"][-1]


@pytest.mark.slow
@pytest.mark.skipif(
    keras.backend.backend() == "torch",
    reason="Keras runs torch eagerly: there is no trace to count",
)
def test_each_step_is_traced_and_compiled_once(tmp_path):
    """Ragged splits (100 training images, 20 test, batch 16: a last
    batch of 4 in each) over two epochs: the train step and the test step
    are each traced once, and on JAX compiled once (tests/compiles.py
    counts; the cache is off). Half the images of 200/40/64, which proved
    the same (a ragged last batch in each split) in twice TensorFlow's
    float16-convolution time."""
    from util import run_script

    from kmp import backend

    counts = run_script(
        "compiles.py",
        "cifar10",
        "--data=synthetic",
        "--synthetic_size=100",
        "--width=8",
        "--batch_size=16",
        "--epochs=2",
        "--policy=mixed_float16",
        "--verbose=0",
        "--compile_cache=off",
        f"--output_dir={tmp_path}",
        backend=backend.name(),
    )
    assert counts["traces"] == {"train_step": 1, "test_step": 1}
    if backend.name() == "jax":
        compiled = counts["compiled"]
        assert (compiled["train_step"], compiled["test_step"]) == (1, 1)
