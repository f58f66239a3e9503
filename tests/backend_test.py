import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from util import jax_only

from kmp import backend


def test_list_devices_reports_at_least_one_device():
    devices = backend.list_devices()
    assert devices
    assert all(d.platform in ("cpu", "gpu", "tpu") for d in devices)


def test_framework_versions_name_the_backend():
    versions = backend.framework_versions()
    assert versions["backend"] == keras.backend.backend()
    assert versions["keras"] == keras.__version__
    assert versions[backend.name()]


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "value, expected",
    [("8.6", (8, 6)), ((7, 5), (7, 5)), ("9", (9, 0)), (None, None)],
)
def test_parse_capability(value, expected):
    assert backend._parse_capability(value) == expected


def test_tf32_is_off_in_tests():
    assert backend.tf32_enabled() is False


def test_add_train_step_logs_wraps_once():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    backend.add_train_step_logs(model, lambda read: {})
    wrapped = model.train_step
    backend.add_train_step_logs(model, lambda read: {})
    assert model.train_step is wrapped


@jax_only
def test_kmp_trains_with_jax_when_tensorflow_cannot_be_imported():
    # The lent GPU machines have JAX but no TensorFlow.
    script = textwrap.dedent(
        """
        import sys
        sys.modules["tensorflow"] = None  # any `import tensorflow` fails
        import numpy as np
        import keras
        import kmp
        kmp.enable("mixed_float16")
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(2, dtype="float32")]
        )
        model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
        history = model.fit(
            np.ones((8, 4)), np.ones((8, 2)), verbose=0,
            callbacks=[kmp.callbacks.LossScaleMonitor()],
        )
        print(kmp.recommend_policy().policy, history.history["loss_scale"])
        assert sys.modules.get("tensorflow") is None
        """
    )
    env = dict(os.environ, KERAS_BACKEND="jax")
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[32768.0]" in result.stdout


@pytest.mark.slow
@jax_only
def test_examples_and_bench_run_with_jax_when_tensorflow_cannot_be_imported(
    tmp_path,
):
    # `kmp bench --backend jax` and the trainers on synthetic data are what
    # runs on a lent GPU, where there is no TensorFlow.
    script = textwrap.dedent(
        f"""
        import importlib.abc
        import sys

        class NoTensorFlow(importlib.abc.MetaPathFinder):
            # Like a machine without it: no entry in sys.modules at all.
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in ("tensorflow", "tensorflow_datasets"):
                    raise ImportError(f"No module named {{name!r}}")

        sys.meta_path.insert(0, NoTensorFlow())
        from kmp.app import bench
        from kmp.examples import cifar10, imdb
        tiny = {{"imdb": {{"d_model": 16, "batch_size": 4,
                          "sequence_length": 8}}}}
        rows = bench.bench_model("imdb", tiny, steps=1, rounds=2, log=None)
        print("bench", len(rows))
        results = cifar10.train(cifar10.Config(
            data="auto", width=8, steps=2, epochs=1, batch_size=8,
            synthetic_size=32, verbose=0, output_dir={str(tmp_path)!r}))
        print("train", results["data"], results["data_note"][:30])
        assert "tensorflow" not in sys.modules
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=dict(os.environ, KERAS_BACKEND="jax"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bench 4" in result.stdout
    assert "train synthetic offline: TFDS cannot be import" in result.stdout


@pytest.mark.parametrize("jit_compile", [False, True])
def test_taped_gradients_by_values_and_tapped_tensors(jit_compile):
    from keras import ops

    def loss_fn(values, args, tap):
        (w,) = values
        (x,) = args
        h = tap("h", ops.cast(w * x, "float16"))
        unused = tap("unused", ops.cast(x, "float16"))
        del unused
        return ops.sum(ops.square(ops.cast(h, "float32")))

    run = backend.taped_gradients(loss_fn, jit_compile)
    x = np.array([1.0, 2.0, 3.0], "float32")
    loss, keys, taps, value_grads, tap_grads = run([np.float32(2.0)], x)
    assert keys == ["h", "unused"]
    assert float(loss) == 4 + 16 + 36
    np.testing.assert_array_equal(ops.convert_to_numpy(taps[0]), 2 * x)
    # d/dh sum(h^2) = 2h, in h's dtype (float16).
    assert keras.backend.standardize_dtype(tap_grads[0].dtype) == "float16"
    np.testing.assert_array_equal(ops.convert_to_numpy(tap_grads[0]), 4 * x)
    # d/dw sum((w x)^2) = 2 w sum(x^2) = 56.
    assert float(value_grads[0]) == 56.0
    unused = tap_grads[1]
    assert unused is None or not np.any(ops.convert_to_numpy(unused))
