import logging

import keras
import pytest

import kmp
from kmp import backend
from kmp import policy as policy_lib
from kmp.backend import Device


@pytest.fixture
def devices(monkeypatch):
    """`devices(*d)` makes kmp see devices `d`; reasons log afresh."""
    monkeypatch.setattr(policy_lib, "_logged_reasons", set())

    def use(*found):
        monkeypatch.setattr(backend, "list_devices", lambda: list(found))

    return use


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", ["mixed_float16", "mixed_bfloat16", "float32"])
def test_enable_sets_policy_and_returns_previous(name):
    keras.config.set_dtype_policy("float32")
    previous = kmp.enable(name)
    assert previous.name == "float32"
    assert keras.config.dtype_policy().name == name
    assert keras.layers.Dense(2).compute_dtype == name.replace("mixed_", "")
    assert kmp.enable(previous).name == name
    assert keras.config.dtype_policy().name == "float32"


@pytest.mark.backend_independent
def test_disable_restores_float32():
    kmp.enable("mixed_bfloat16")
    assert kmp.disable().name == "mixed_bfloat16"
    assert keras.config.dtype_policy().name == "float32"


@pytest.mark.backend_independent
@pytest.mark.parametrize("bad", ["float16", "mixed", "", None, 3])
def test_enable_rejects_unknown_policies(bad):
    with pytest.raises(ValueError, match="Unsupported dtype policy"):
        kmp.enable(bad)


@pytest.mark.backend_independent
def test_policy_scope_restores_on_exception():
    kmp.enable("mixed_bfloat16")
    with pytest.raises(RuntimeError):
        with kmp.policy_scope("mixed_float16") as active:
            assert active.name == "mixed_float16"
            assert keras.layers.Dense(1).compute_dtype == "float16"
            raise RuntimeError("boom")
    assert keras.config.dtype_policy().name == "mixed_bfloat16"


@pytest.mark.backend_independent
def test_auto_uses_the_recommendation_and_logs_reason_once(monkeypatch, caplog):
    monkeypatch.setattr(
        backend, "list_devices", lambda: [Device("gpu", "V100", (7, 0))]
    )
    monkeypatch.setattr(policy_lib, "_logged_reasons", set())
    with caplog.at_level(logging.INFO, logger="kmp"):
        kmp.enable("auto")
        kmp.enable("auto")
    assert keras.config.dtype_policy().name == "mixed_float16"
    messages = [r.message for r in caplog.records]
    assert len(messages) == 1 and "'auto' -> mixed_float16" in messages[0]


@pytest.mark.backend_independent
def test_mixed_policy_on_cpu_warns_once(devices, caplog):
    devices(Device("cpu", "x"))
    with caplog.at_level(logging.WARNING, logger="kmp"):
        kmp.enable("mixed_float16")
        kmp.enable("mixed_float16")
        kmp.enable("float32")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "slower than float32" in warnings[0].message


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_the_cpu_line_is_every_model_s(devices, policy, caplog):
    # What a float16 attention meets on JAX's CPU is the audit's to say,
    # of a model that has one (`environment_checks_test`).
    devices(Device("cpu", "x"))
    with caplog.at_level(logging.WARNING, logger="kmp"):
        kmp.enable(policy)
    (line,) = [r.message for r in caplog.records]
    assert "slower than float32" in line
    assert "attention" not in line


@pytest.mark.backend_independent
def test_bfloat16_on_a_gpu_without_bfloat16_tensor_cores_warns(devices, caplog):
    devices(Device("gpu", "T4", (7, 5)))
    with caplog.at_level(logging.WARNING, logger="kmp"):
        kmp.enable("mixed_bfloat16")
        kmp.enable("mixed_float16")
    assert [r.message[:50] for r in caplog.records] == [
        "kmp: mixed_bfloat16 has no tensor cores here; mixe"
    ]


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "devices, expected",
    [
        ([Device("cpu", "x")], "float32"),
        ([Device("gpu", "A100", (8, 0))], "mixed_bfloat16"),
        ([Device("gpu", "H100", (9, 0))], "mixed_bfloat16"),
        ([Device("gpu", "V100", (7, 0))], "mixed_float16"),
        ([Device("gpu", "T4", (7, 5))], "mixed_float16"),
        ([Device("gpu", "P100", (6, 0))], "float32"),
        ([Device("gpu", "ROCm GPU", None)], "float32"),
        (
            [Device("gpu", "A100", (8, 0)), Device("gpu", "T4", (7, 5))],
            "mixed_float16",
        ),
        ([Device("tpu", "TPU v4"), Device("cpu", "x")], "mixed_bfloat16"),
    ],
)
def test_choose_policy(devices, expected):
    recommendation = policy_lib.choose_policy(devices)
    assert recommendation.policy == expected
    assert isinstance(recommendation.reason, str) and recommendation.reason


def test_recommend_policy_on_this_machine_returns_choice_and_reason():
    policy, reason = kmp.recommend_policy()
    assert policy in ("float32", "mixed_float16", "mixed_bfloat16")
    if all(d.platform == "cpu" for d in backend.list_devices()):
        assert policy == "float32" and "CPU" in reason


def test_bfloat16_master_weights_need_bfloat16_compute_and_restore():
    with pytest.raises(kmp.InputError, match="computes in bfloat16"):
        kmp.enable("mixed_float16", master_weights="bfloat16")
    with pytest.raises(kmp.InputError, match="master_weights='float16'"):
        kmp.enable("mixed_bfloat16", master_weights="float16")
    previous = kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    policy = keras.config.dtype_policy()
    assert (policy.compute_dtype, policy.variable_dtype) == ("bfloat16",) * 2
    kmp.enable(previous)
    back = kmp.enable(policy)  # what enable returned restores the mode
    assert keras.config.dtype_policy().variable_dtype == "bfloat16"
    kmp.enable(back)
    # Under float32 masters the default rounding changes nothing, once
    # the optimizer is built on them (`kmp.memory.modes`).
    kmp.enable("mixed_bfloat16")
    optimizer = keras.optimizers.Adam()
    kind = type(optimizer)
    assert kmp.wrap(optimizer) is optimizer
    optimizer.build([keras.Variable([1.0])])
    assert type(optimizer) is kind


def _dense_model():
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(2)(inputs))


def _reset_warnings(recorded):
    return [str(w.message) for w in recorded if "kmp.enable(" in str(w.message)]


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "reset",
    [keras.utils.clear_session, keras.backend.clear_session],
    ids=["keras.utils", "keras.backend"],
)
def test_clear_session_after_enable_warns_at_wrap_and_pin(reset):
    # keras-io's segmentation example calls clear_session before it
    # builds its model: without a warning the run is silently float32.
    kmp.enable("mixed_float16")
    reset()
    with pytest.warns(UserWarning) as recorded:
        model = kmp.pin_float32(_dense_model())
        optimizer = kmp.wrap("sgd")
    said = _reset_warnings(recorded)
    assert len(said) == 2, said
    assert said[0].startswith("kmp.pin_float32: kmp.enable('mixed_float16')")
    assert said[1].startswith("kmp.wrap: kmp.enable('mixed_float16')")
    assert "it is 'float32' now" in said[1]
    assert "clear_session" in said[1] and "kmp.disable()" in said[1]
    # Pointing at the user's calls, not into kmp.
    assert {
        w.filename for w in recorded if "kmp.enable(" in str(w.message)
    } == {__file__}
    # What the warning is about: float32 layers, no loss scale.
    assert model.layers[-1].compute_dtype == "float32"
    assert not isinstance(optimizer, kmp.LossScaleOptimizer)


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "after",
    [
        "nothing",  # kmp.enable's policy is in force
        "enable again",  # the fix the warning gives
        "disable",  # float32 on purpose
        "scope",  # policy_scope restored the float32 policy
        "auto on this CPU",  # kmp chose float32
        "bfloat16 by Keras",  # a 16-bit policy, set another way
    ],
)
def test_no_reset_warning_when_kmp_knows_the_policy(after, recwarn):
    if after == "scope":
        with kmp.policy_scope("mixed_float16"):
            pass
    elif after == "auto on this CPU":
        kmp.enable("auto")
    else:
        kmp.enable("mixed_float16")
    if after == "enable again":
        keras.utils.clear_session()
        kmp.enable("mixed_float16")
    elif after == "disable":
        kmp.disable()
    elif after == "bfloat16 by Keras":
        keras.config.set_dtype_policy("mixed_bfloat16")
    kmp.pin_float32(_dense_model())
    kmp.wrap("sgd")
    assert _reset_warnings(recwarn.list) == []
    assert policy_lib.warn_if_reset("wrap") is False


@pytest.mark.backend_independent
def test_set_dtype_policy_float32_after_enable_warns():
    kmp.enable("mixed_bfloat16")
    keras.config.set_dtype_policy("float32")
    with pytest.warns(UserWarning, match=r"kmp.enable\('mixed_bfloat16'\)"):
        assert policy_lib.warn_if_reset("wrap") is True
