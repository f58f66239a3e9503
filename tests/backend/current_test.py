"""Which backend runs (`kmp.backend._current`), and the rule that goes
with branching on it: each framework is imported only inside its branch,
so kmp runs under JAX or torch where TensorFlow is not installed."""

import os
import subprocess
import sys
import textwrap

import keras
import pytest
from util import not_tf

from kmp import backend


def test_name_is_keras_s_backend_and_only_jax_steps_are_stateless():
    assert backend.name() == keras.backend.backend()
    assert backend.is_stateless() == (backend.name() == "jax")


# Prepended to a script: TensorFlow and TFDS cannot be imported, as on a
# machine without them (the lent GPU machines have JAX and PyTorch only).
# `find_spec` still answers, with a spec that fails to load, because
# torch's dynamo asks for TensorFlow's location when it starts; nothing
# is left in sys.modules.
WITHOUT_TENSORFLOW = textwrap.dedent(
    """
    import importlib.abc
    import importlib.machinery
    import sys

    class _Absent(importlib.abc.Loader):
        def create_module(self, spec):
            raise ModuleNotFoundError(
                f"No module named {spec.name!r}", name=spec.name
            )

        def exec_module(self, module):
            pass

    class _NoTensorFlow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("tensorflow", "tensorflow_datasets"):
                return importlib.machinery.ModuleSpec(name, _Absent())

    sys.meta_path.insert(0, _NoTensorFlow())
    """
)


def _run_without_tensorflow(script, absent=True):
    """Runs `script` under this backend, with TensorFlow absent (or, with
    `absent=False`, installed); it must end without having imported it.
    Returns its stdout."""
    script = (
        (WITHOUT_TENSORFLOW if absent else "import sys\n")
        + textwrap.dedent(script)
        + textwrap.dedent(
            """
            loaded = [
                m for m in sys.modules if m.split(".")[0] == "tensorflow"
            ]
            assert not loaded, loaded[:5]
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=dict(os.environ, KERAS_BACKEND=backend.name()),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@not_tf
def test_kmp_imports_no_tensorflow_where_it_is_installed():
    # The library, under JAX or torch: fit with kmp's scaler and monitor,
    # pinning, float8, audit, diagnose. (The application seeds with
    # Keras's set_random_seed, which imports TensorFlow when installed,
    # for tf.data; it runs without it: the next test.)
    stdout = _run_without_tensorflow(
        absent=False,
        script="""
        import numpy as np
        import keras
        import kmp
        kmp.enable("mixed_float16")
        model = kmp.pin_float32(keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(2)]
        ))
        model.compile(
            optimizer=kmp.wrap("sgd", initial_scale=1024), loss="mse"
        )
        history = model.fit(
            np.ones((8, 4)), np.ones((8, 2)), verbose=0,
            callbacks=[kmp.callbacks.LossScaleMonitor()],
        )
        kmp.audit(model, verbose=False)
        kmp.diagnose(model, (np.ones((8, 4)), np.ones((8, 2))))
        with kmp.policy_scope("mixed_bfloat16"):
            wide = keras.Sequential(
                [keras.Input((16,)), keras.layers.Dense(16),
                 keras.layers.Dense(2, dtype="float32")]
            )
        kmp.audit(kmp.float8(wide), verbose=False)
        print(kmp.recommend_policy().policy, history.history["loss_scale"])
        """,
    )
    assert "float32 [1024.0]" in stdout


@pytest.mark.slow
@not_tf
def test_examples_bench_and_doctor_run_when_tensorflow_cannot_be_imported(
    tmp_path,
):
    # `kmp bench`, the trainers (the LM's memory modes too) and the
    # doctor on synthetic data are what runs on a lent GPU, where there
    # is no TensorFlow.
    stdout = _run_without_tensorflow(
        f"""
        from kmp.app import bench
        import kmp_cli
        from kmp.examples import cifar10
        tiny = {{"imdb": {{"d_model": 16, "batch_size": 4,
                          "sequence_length": 8}}}}
        rows = bench.bench_model("imdb", tiny, steps=1, rounds=2, log=None)
        print("bench", len(rows))
        results = cifar10.train(cifar10.Config(
            data="auto", width=8, steps=2, epochs=1, batch_size=8,
            synthetic_size=32, verbose=0, output_dir={str(tmp_path)!r}))
        print("train", results["data"], results["data_note"][:30])
        from kmp.examples import lm  # KerasHub's fit on grain batches
        results = lm.train(lm.Config(
            steps=2, epochs=1, batch_size=4, hidden_dim=16, heads=2,
            layers=1, sequence_length=16, text_bytes=2_000, verbose=0,
            optimizer_states="int8", output_dir={str(tmp_path / "lm")!r}))
        print("lm", results["epochs"], results["config"]["optimizer_states"])
        kmp_cli.main(["doctor", "imdb", "--data=synthetic",
                      "--synthetic_size=64", "--d_model=16",
                      "--sequence_length=8", "--batch_size=8", "--batches=1",
                      "--output_dir={tmp_path / "doctor"}"])
        """
    )
    assert "bench 4" in stdout
    assert "train synthetic offline: TFDS cannot be import" in stdout
    assert "lm 1 int8" in stdout
    assert (tmp_path / "doctor" / "doctor.json").exists()
