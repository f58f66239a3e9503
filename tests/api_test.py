import pytest

import kmp

pytestmark = pytest.mark.backend_independent

PUBLIC = {
    "AuditReport",
    "Finding",
    "InputError",
    "InputTypeError",
    "audit",
    "LossScaleOptimizer",
    "Recommendation",
    "__version__",
    "callbacks",
    "disable",
    "enable",
    "enable_compile_cache",
    "layers",
    "load_model",
    "pin_float32",
    "policy_scope",
    "recommend_policy",
    "wrap",
    "distribute",
    "multi_worker_strategy",
    "initialize_processes",
    "is_chief",
    "parse_tf_config",
    "diagnose",
    "Diagnosis",
    "float8",
    "rematerialize",
}


MODULES = {"callbacks", "layers"}
CLASSES = {
    "AuditReport",
    "Diagnosis",
    "Finding",
    "InputError",
    "InputTypeError",
    "LossScaleOptimizer",
    "Recommendation",
}


def test_public_names_exist_and_match_all():
    import inspect

    import keras

    assert set(kmp.__all__) == PUBLIC
    for name in PUBLIC - MODULES - CLASSES - {"__version__"}:
        function = getattr(kmp, name)
        # A function of kmp's own (not, say, a submodule that shadowed it
        # when imported: kmp.float8 must stay the function).
        assert inspect.isfunction(function), name
        assert function.__module__.startswith("kmp."), name
    for name in CLASSES:
        assert inspect.isclass(getattr(kmp, name)), name
    for name in MODULES:
        assert inspect.ismodule(getattr(kmp, name)), name
    assert issubclass(kmp.callbacks.LossScaleMonitor, keras.callbacks.Callback)
    assert issubclass(kmp.LossScaleOptimizer, keras.optimizers.Optimizer)
    assert issubclass(kmp.layers.Float8Dense, keras.layers.Dense)
    assert issubclass(kmp.InputTypeError, (ValueError, TypeError))


def test_the_version_is_the_package_s():
    import importlib.metadata

    assert kmp.__version__ == importlib.metadata.version("kmp")


def test_kmp_classes_are_registered_for_serialization():
    import keras

    for name, cls in [
        ("LossScaleOptimizer", kmp.LossScaleOptimizer),
        ("Float32Softmax", kmp.layers.Float32Softmax),
        ("Float32Activation", kmp.layers.Float32Activation),
        ("MultiHeadAttention", kmp.layers.MultiHeadAttention),
    ]:
        assert keras.saving.get_registered_object(f"kmp>{name}") is cls


def test_ci_runs_the_readme_test_command_verbatim():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    ci = (root / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert "pytest" in ci
    assert f"\n{ci}\n" in (root / "README.md").read_text()
