"""kmp.auditing.normalization_checks: the audit's findings on Keras's
`Normalization` layers."""

import keras
import numpy as np
import pytest

import kmp


def _normalization_findings(layer):
    inputs = keras.Input((1,))
    model = keras.Model(inputs, keras.layers.Dense(2)(layer(inputs)))
    report = kmp.audit(model, verbose=False)
    return [f for f in report if "Normalization" in f.problem]


@pytest.mark.parametrize(
    "policy, variance, severity, problem",
    [
        (
            "mixed_bfloat16",
            0.25,
            "warning",
            "Normalization computes in bfloat16: it rounds raw values (its "
            "input; its output with invert=True) and its mean to 8 "
            "significant bits",
        ),
        (
            "mixed_float16",
            9e6,  # a price's: a standard deviation of 3000
            "error",
            "Normalization computes in float16, and its statistics reach "
            "9e+06, over float16's largest value (65504)",
        ),
    ],
)
def test_a_16_bit_normalization_is_a_finding(
    policy, variance, severity, problem
):
    keras.config.set_dtype_policy(policy)  # Keras's own
    layer = keras.layers.Normalization(mean=0.5, variance=variance)
    (finding,) = _normalization_findings(layer)
    assert finding.severity == severity
    assert finding.problem.startswith(problem)
    assert finding.fix == "kmp.pin_float32(model)."
    kmp.enable(policy)  # made under kmp's policy: float32, no finding
    layer = keras.layers.Normalization(mean=0.5, variance=variance)
    assert _normalization_findings(layer) == []
    assert layer.dtype_policy.name == "float32"


def test_statistics_a_16_bit_adapt_made_infinite_are_an_error():
    # What Keras's adapt over batches leaves on JAX and torch when it runs
    # in float16, outside kmp's policy (a layer made in a
    # kmp.policy_scope, adapted after it; TensorFlow refuses that adapt):
    # an infinite variance, which pinning the layer keeps.
    keras.config.set_dtype_policy("mixed_float16")
    layer = keras.layers.Normalization()
    layer.build((None, 1))
    layer.adapt_mean.assign([5000.0])
    layer.adapt_variance.assign([np.inf])
    layer.finalize_state()
    kmp.enable("mixed_float16")
    inputs = keras.Input((1,))
    model = kmp.pin_float32(
        keras.Model(inputs, keras.layers.Dense(2)(layer(inputs)))
    )
    assert layer.dtype_policy.name == "float32"
    report = kmp.audit(model, verbose=False)
    (finding,) = [f for f in report if "Normalization" in f.problem]
    assert finding.severity == "error"
    assert finding.problem.startswith(
        "Normalization's statistics are not finite (an adapt in 16 bits"
    )
    assert finding.fix.startswith("Adapt it again under kmp.enable")


def test_statistics_stored_in_bfloat16_are_a_warning():
    # Built before kmp's policy, under Keras's bfloat16 (what bfloat16
    # master weights use): pinned, it computes in float32 over bfloat16
    # variables, whose mean of a year (2003.4) is 2000 or 2008.
    keras.config.set_dtype_policy("bfloat16")
    layer = keras.layers.Normalization()
    layer.build((None, 1))
    kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    layer.adapt(np.full((8, 1), 2003.4, "float32"))
    assert layer.dtype_policy.name != "bfloat16"  # computes in float32
    (finding,) = _normalization_findings(layer)
    assert finding.severity == "warning"
    assert finding.problem.startswith(
        "Normalization's statistics are stored in bfloat16"
    )


@pytest.mark.parametrize(
    "policy, harm",
    [
        ("mixed_float16", "a raw value of 65520 or more"),
        ("mixed_bfloat16", "a raw value keeps 8 significant bits"),
    ],
)
def test_a_16_bit_rescaling_is_a_warning_until_pinned(policy, harm):
    kmp.enable(policy)
    inputs = keras.Input((4,), dtype="uint16")
    scaled = keras.layers.Rescaling(1 / 65535, name="scale")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(scaled))

    def findings():
        report = kmp.audit(model, verbose=False)
        return [f for f in report if "Rescaling" in f.problem]

    (finding,) = findings()
    assert (finding.severity, finding.where) == ("warning", "scale")
    half = policy.removeprefix("mixed_")
    assert finding.problem.startswith(
        f"Rescaling casts its input to {half} before it scales it (its "
        f"input is uint16): {harm}"
    )
    assert finding.fix == "kmp.pin_float32(model)."
    kmp.pin_float32(model)
    assert findings() == []
    # An 8-bit image: both 16-bit dtypes hold every value, nothing to
    # say (the review: every keras-io image model was told). A float
    # input's range the graph does not say: an info.
    for dtype, said in (("uint8", []), ("float32", ["info"])):
        inputs = keras.Input((4,), dtype=dtype)
        scaled = keras.layers.Rescaling(1 / 255)(inputs)
        model = keras.Model(inputs, keras.layers.Dense(2)(scaled))
        assert [f.severity for f in findings()] == said
    # One that scales a 16-bit layer's output is no finding.
    kmp.enable(policy)
    inputs = keras.Input((4,))
    logits = keras.layers.Dense(2)(inputs)
    scaled = keras.layers.Rescaling(0.125)(logits)
    model = keras.Model(inputs, keras.layers.Dense(2)(scaled))
    assert findings() == []
