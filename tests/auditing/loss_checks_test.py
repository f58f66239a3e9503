"""What reads a model's outputs (`kmp.auditing.loss_checks`), through
`kmp.audit` and directly: a 16-bit probability output by the loss that
reads it, and the crossentropies a trainer of models applies."""

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


class VAE(keras.Model):
    """keras-io's VAE's loss, short (read, never run)."""

    def train_step(self, data):
        reconstruction = self.decoder(self.encoder(data))
        loss = keras.losses.binary_crossentropy(data, reconstruction)
        return {"loss": keras.ops.mean(loss)}


class GAN(keras.Model):
    """keras-io's GAN: a crossentropy given to its `compile`."""

    def compile(self, loss_fn):
        super().compile()
        self.loss_fn = loss_fn

    def train_step(self, data):
        return {"d_loss": self.loss_fn(data, self.discriminator(data))}


def test_a_trainer_s_crossentropies_are_read_from_its_step():
    assert loss_checks.trainer_losses(VAE()) == ["binary_crossentropy"]
    # A loss it holds reads some model's output, not known which: the
    # guide's GAN's reads the discriminator's logits, and its generator's
    # sigmoid images were called a crossentropy's error (a review).
    gan = GAN()
    gan.compile(loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    assert loss_checks.trainer_losses(gan) == []
