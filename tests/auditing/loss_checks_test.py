"""What reads a model's outputs (`kmp.auditing.loss_checks`), through
`kmp.audit` and directly: a 16-bit probability output by the loss that
reads it, and the crossentropies a trainer of models applies."""

import keras
import pytest
from audit_util import compiled_for_audit
from audit_util import quiet_audit
from audit_util import small_mlp
from keras_io_models import compiled_gan
from keras_io_models import dcgan_discriminator
from keras_io_models import dcgan_generator
from keras_io_models import gan_class
from keras_io_models import vae_class
from keras_io_models import vae_decoder
from keras_io_models import vae_encoder

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


def _model(name, activation):
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(4, activation=activation)(inputs)
    return keras.Model(inputs, outputs, name=name)


class VAE(keras.Model):
    """keras-io's VAE's step, short (read, never run)."""

    def __init__(self):
        super().__init__()
        self.encoder = _model("encoder", None)
        self.decoder = _model("decoder", "sigmoid")

    def train_step(self, data):
        z_mean, z_log_var, z = self.encoder(data)
        reconstruction = self.decoder(z)
        loss = keras.ops.mean(
            keras.ops.sum(
                keras.losses.binary_crossentropy(data, reconstruction),
                axis=(1, 2),
            )
        )
        return {"loss": loss + keras.ops.mean(z_mean)}


class GAN(keras.Model):
    """keras-io's DCGAN's step, short: a crossentropy given to its
    `compile`, the generator's images joined with the real ones before
    the discriminator reads them."""

    def __init__(self):
        super().__init__()
        self.discriminator = _model("discriminator", "sigmoid")
        self.generator = _model("generator", "sigmoid")

    def compile(self, loss_fn):
        super().compile()
        self.loss_fn = loss_fn

    def train_step(self, data):
        generated_images = self.generator(data)
        combined = keras.ops.concatenate([generated_images, data], axis=0)
        predictions = self.discriminator(combined)
        d_loss = self.loss_fn(data, predictions)
        predictions = self.discriminator(self.generator(data))
        g_loss = self.loss_fn(data, predictions)
        return {"d_loss": d_loss, "g_loss": g_loss}


def test_a_trainer_s_crossentropies_are_read_from_its_step():
    assert loss_checks.trainer_losses(VAE()) == {
        "decoder": ["binary_crossentropy"]
    }
    # A loss it holds reads the discriminator's output, and the
    # generator's images only through it: the generator's sigmoid is
    # no crossentropy's (a review found that error on the guide's GAN).
    gan = GAN()
    gan.compile(loss_fn=keras.losses.BinaryCrossentropy())
    assert loss_checks.trainer_losses(gan) == {
        "discriminator": ["binary_crossentropy"]
    }
    # The guide's GAN's reads logits.
    gan.compile(loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    assert loss_checks.trainer_losses(gan) == {}


@pytest.mark.backend_independent
def test_keras_io_s_dcgan_discriminator_sigmoid_is_its_loss_s_error():
    # Its step is TensorFlow's. The audit counted only crossentropies the
    # step calls by name, so the discriminator's float16 sigmoid under
    # the held `BinaryCrossentropy()` was a warning (stop 70's lead).
    # The VAE's decoder, as keras-io writes it (its `Sampling` draws
    # float32: built before the policy).
    vae = vae_class()(vae_encoder(), vae_decoder())
    assert loss_checks.trainer_losses(vae) == {
        "decoder": ["binary_crossentropy"]
    }
    kmp.enable("mixed_float16")
    gan = compiled_gan(
        gan_class(), dcgan_discriminator(), dcgan_generator(), kmp.wrap
    )
    assert loss_checks.trainer_losses(gan) == {
        "discriminator": ["binary_crossentropy"]
    }
    found = {
        f.where.split("/")[0]: f
        for f in quiet_audit(gan)
        if "float16 sigmoid" in f.problem
    }
    assert found["discriminator"].severity == "error"
    assert "past float16's 65504" in found["discriminator"].problem
    assert found["generator"].severity == "warning"
