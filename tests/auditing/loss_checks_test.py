"""What reads a model's outputs (`kmp.auditing.loss_checks`), through
`kmp.audit` and directly: a 16-bit probability output by the loss that
reads it."""

import functools

import keras
import pytest
from audit_util import compiled_for_audit
from audit_util import quiet_audit
from audit_util import small_mlp

import kmp
from kmp import backend
from kmp.auditing import loss_checks


def contrastive_loss(y, distance):  # keras-io's siamese network's, named
    return keras.ops.mean(keras.ops.square(distance - y))


@pytest.mark.parametrize(
    "loss, severity, said",
    [
        # Not compiled: a sigmoid may make images (a GAN's generator).
        (None, "warning", "the loss (not known yet: an error under a"),
        ("binary_crossentropy", "error", "past float16's 65504"),
        ("mse", "warning", "the loss (mse) reads probabilities rounded"),
        (
            contrastive_loss,
            "warning",
            "the loss (contrastive_loss) reads probabilities rounded",
        ),
    ],
)
def test_a_16_bit_sigmoid_output_is_an_error_under_a_crossentropy(
    loss, severity, said
):
    # Any other loss reads rounded probabilities, and no logits path is
    # lost (helper, keras-io's siamese contrastive network: "an error ...
    # crossentropy of 16.1" under its contrastive loss).
    kmp.enable("mixed_float16")
    model = small_mlp(activation="sigmoid")
    if loss is not None:
        model = compiled_for_audit(model, loss=loss)
    (finding,) = [f for f in quiet_audit(model) if "Model output" in f.problem]
    assert finding.severity == severity
    assert finding.problem.startswith("Model output is a float16 sigmoid")
    assert said in finding.problem
    # Only TensorFlow has a logits path to lose (defect 8); the gradient
    # that overflows is every backend's (stock_keras_test).
    logits = backend.name() == "tensorflow" and severity == "error"
    assert ("loses Keras's logits path" in finding.problem) == logits


def test_a_bfloat16_probability_output_is_an_error_where_logits_are_lost():
    kmp.enable("mixed_bfloat16")
    model = compiled_for_audit(
        small_mlp(policy="mixed_bfloat16"), loss="categorical_crossentropy"
    )
    (finding,) = [f for f in quiet_audit(model) if "Model output" in f.problem]
    assert "rounded to bfloat16" in finding.problem
    assert "65504" not in finding.problem  # no loss scale, no overflow
    logits = backend.name() == "tensorflow"
    assert finding.severity == ("error" if logits else "warning")


def test_loss_names_read_names_and_from_logits():
    model = small_mlp()
    model.compile(
        loss=[
            keras.losses.BinaryCrossentropy(from_logits=True),
            functools.partial(
                keras.losses.categorical_crossentropy, from_logits=True
            ),
            "mse",
            contrastive_loss,
            lambda y, p: p,  # a callable named "<lambda>" counts by it
        ]
    )
    assert loss_checks.loss_names(model) == [
        ("binary_crossentropy", True),
        ("categorical_crossentropy", True),
        ("mse", False),
        ("contrastive_loss", False),
        ("<lambda>", False),
    ]
