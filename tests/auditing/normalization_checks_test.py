"""kmp.auditing.normalization_checks: the audit's findings on Keras's
`Normalization` layers."""

import keras
import numpy as np

import kmp

RNG = np.random.default_rng(0)
# A price: a standard deviation of 3000, a variance over float16's 65504.
PRICES = RNG.normal(5000, 3000, (256, 1)).astype("float32")


def _normalization_findings(layer, width=1):
    inputs = keras.Input((width,))
    model = keras.Model(inputs, keras.layers.Dense(2)(layer(inputs)))
    report = kmp.audit(model, verbose=False)
    return [f for f in report if "Normalization" in f.problem]


def test_a_16_bit_normalization_within_range_is_a_warning():
    keras.config.set_dtype_policy("mixed_bfloat16")  # Keras's own
    layer = keras.layers.Normalization(mean=0.5, variance=0.25)
    (finding,) = _normalization_findings(layer)
    assert finding.severity == "warning"
    assert finding.problem.startswith(
        "Normalization computes in bfloat16: it rounds raw values (its "
        "input; its output with invert=True) and its mean to 8 significant "
        "bits"
    )
    assert finding.fix == "kmp.pin_float32(model)."


def test_a_variance_past_float16_s_range_is_an_error():
    keras.config.set_dtype_policy("mixed_float16")
    layer = keras.layers.Normalization(mean=5000.0, variance=9e6)
    (finding,) = _normalization_findings(layer)
    assert finding.severity == "error"
    assert finding.problem.startswith(
        "Normalization computes in float16, and its statistics reach 9e+06,"
        " over float16's largest value (65504)"
    )
    kmp.enable("mixed_float16")  # made under kmp's policy: float32
    layer = keras.layers.Normalization(mean=5000.0, variance=9e6)
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
