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
