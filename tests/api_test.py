import kmp

PUBLIC = {
    "LossScaleOptimizer",
    "Recommendation",
    "__version__",
    "callbacks",
    "disable",
    "enable",
    "policy_scope",
    "recommend_policy",
    "wrap",
}


def test_public_names_exist_and_match_all():
    assert set(kmp.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(kmp, name) is not None
    assert kmp.callbacks.LossScaleMonitor is not None


def test_loss_scale_optimizer_is_registered_for_serialization():
    import keras

    assert (
        keras.saving.get_registered_object("kmp>LossScaleOptimizer")
        is kmp.LossScaleOptimizer
    )


def test_ci_runs_the_readme_test_command_verbatim():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    ci = (root / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert "pytest" in ci
    assert f"\n{ci}\n" in (root / "README.md").read_text()
