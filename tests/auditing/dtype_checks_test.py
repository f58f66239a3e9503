"""The audit's checks of the user's code against 16-bit dtypes
(`kmp.auditing.dtype_checks`), on keras-io's examples as written
(`keras_io_models`): the text classifier's float token ids, the VAE's
float32 draw, the DCGAN's `tf.concat`; and no such finding on kmp's and
keras-io's other models."""

import random

import keras
import keras_io_steps
import pytest
from audit_util import has
from audit_util import quiet_audit
from audit_util import small_mlp
from keras_io_models import Sampling
from keras_io_models import TokenAndPositionEmbedding
from keras_io_models import compiled_gan
from keras_io_models import dcgan_discriminator
from keras_io_models import dcgan_generator
from keras_io_models import gan_class
from keras_io_models import keras3_gan_class
from keras_io_models import text_classifier
from keras_io_models import vae_decoder
from keras_io_models import vae_encoder
from util import small_gpt2_backbone

import kmp
from kmp import backend

independent = pytest.mark.backend_independent

IDS = "Token ids from the float input"
DRAW = "draws keras.random.normal(...) without dtype="
JOIN = "in tf.concat, which does not promote"


@independent
def test_float_token_ids_are_an_error_until_pinned():
    kmp.enable("mixed_float16")
    model = text_classifier()
    (finding,) = [f for f in quiet_audit(model) if IDS in f.problem]
    assert finding.severity == "error"
    assert finding.where == model.layers[1].path
    assert "reach TokenAndPositionEmbedding" in finding.problem
    assert "exactly only up to 2048" in finding.problem
    assert (
        "the last id, 19999, becomes 20000, past the table" in finding.problem
    )
    assert "keras.Input(..., dtype='int32')" in finding.fix
    assert "kmp.pin_float32(model)" in finding.fix
    assert not has(quiet_audit(kmp.pin_float32(model)), IDS)
    kmp.enable("mixed_bfloat16")
    (finding,) = [f for f in quiet_audit(text_classifier()) if IDS in f.problem]
    assert "up to 256" in finding.problem
    assert "the last id, 19999, becomes 19968." in finding.problem
    kmp.disable()
    assert not has(quiet_audit(text_classifier()), IDS)
    kmp.enable("mixed_float16")
    ids = keras.Input((200,), dtype="int32")
    declared = keras.Model(ids, TokenAndPositionEmbedding(200, 20000, 8)(ids))
    assert not has(quiet_audit(declared), IDS)


def test_keras_io_s_vae_draw_is_a_warning_where_the_audit_sees_it():
    kmp.enable("mixed_float16")
    if backend.name() == "tensorflow":
        # The encoder cannot be built here (the draw's TypeError, with
        # kmp's line: tests/backend/dtype_errors_test.py); a subclassed
        # model holding Sampling can, and the audit reads it first.
        class Encoder(keras.Model):
            def __init__(self):
                super().__init__()
                self.sampling = Sampling()

        model = Encoder()
    else:  # JAX and torch promote: z comes out float32
        model = vae_encoder()
        assert keras.backend.standardize_dtype(model.outputs[2].dtype) == (
            "float32"
        )
    (finding,) = [f for f in quiet_audit(model) if DRAW in f.problem]
    assert finding.severity == "warning"
    assert finding.problem.startswith("Sampling.call draws")
    assert "keras.random.normal(..., dtype=self.compute_dtype)" in finding.fix
    # The class: each Sampling layer (SimCLR's two augmenters had each a
    # RandomColorAffine; the fix named the first one's name only).
    assert "kmp.pin_float32(model, also=[Sampling])" in finding.fix


class DrawsInItsDtype(Sampling):
    def call(self, inputs):
        z_mean, z_log_var = inputs
        epsilon = keras.random.normal(
            keras.ops.shape(z_mean),
            dtype=self.compute_dtype,
            seed=self.seed_generator,
        )
        return z_mean + keras.ops.exp(0.5 * z_log_var) * epsilon


class CastsItsDraw(Sampling):
    """The draw made float32, then cast: the fix kmp's line names."""

    def call(self, inputs):
        z_mean, z_log_var = inputs
        epsilon = keras.random.normal(
            keras.ops.shape(z_mean), seed=self.seed_generator
        )
        epsilon = keras.ops.cast(epsilon, self.compute_dtype)
        return z_mean + keras.ops.exp(0.5 * z_log_var) * epsilon


class CastsWhatItsDrawsMade(keras.layers.Layer):
    """keras-io's SimCLR's RandomColorAffine, its colour matrix cast."""

    def call(self, images):
        scales = 1 + keras.random.uniform((2, 1, 1, 1), -0.5, 0.5)
        jitter = keras.random.uniform((2, 1, 3, 3), -0.1, 0.1)
        transforms = keras.ops.eye(3) * scales + jitter
        transforms = keras.ops.cast(transforms, self.compute_dtype)
        return keras.ops.matmul(images, transforms)


class CastsItsInputFirst(keras.layers.Layer):
    """The input cast, then a float32 draw added: TensorFlow refuses."""

    def call(self, x):
        x = keras.ops.cast(x, self.compute_dtype)
        x = x + keras.random.normal(keras.ops.shape(x), stddev=0.1)
        return x


class DrawsWithKeywords(Sampling):
    """The dtype passed in `**kwargs` (helper: keras-io-style code that
    builds the draw's arguments): not read, so not reported."""

    def call(self, inputs):
        z_mean, z_log_var = inputs
        options = {"dtype": self.compute_dtype, "seed": self.seed_generator}
        epsilon = keras.random.normal(keras.ops.shape(z_mean), **options)
        return z_mean + keras.ops.exp(0.5 * z_log_var) * epsilon


class PythonScalar(keras.layers.Layer):
    def call(self, x):
        return x * random.uniform(0.9, 1.1)  # Python's: a float


def _tensorflow_draw():
    import tensorflow as tf

    class Noise(keras.layers.Layer):
        def call(self, x):
            return x + tf.random.normal(tf.shape(x))

    return Noise()


@independent
def test_a_draw_in_the_layer_s_dtype_or_a_float32_layer_is_no_finding():
    kmp.enable("mixed_float16")
    z = keras.Input((2,))
    for sampling in (
        DrawsInItsDtype(),
        Sampling(dtype="float32"),
        CastsItsDraw(),
        DrawsWithKeywords(),
    ):
        model = keras.Model(z, sampling([z, z]))
        assert not has(quiet_audit(model), "without dtype=")
    images = keras.Input((4, 4, 3))
    model = keras.Model(images, CastsWhatItsDrawsMade()(images))
    assert not has(quiet_audit(model), "without dtype=")
    # A cast before the draw is not the draw's.
    noisy = keras.Sequential([CastsItsInputFirst()])
    assert has(quiet_audit(noisy), "CastsItsInputFirst.call draws")
    # Python's random module draws Python floats, which do not clash.
    assert not has(quiet_audit(keras.Sequential([PythonScalar()])), "dtype=")
    # TensorFlow's draws are float32 too (a model not built: subclassed).
    noisy = keras.Sequential([_tensorflow_draw()])
    assert has(quiet_audit(noisy), "Noise.call draws tf.random.normal(...)")


@independent
def test_keras_io_s_dcgan_concat_is_a_warning_until_its_generator_is_pinned():
    kmp.enable("mixed_float16")
    gan = compiled_gan(
        gan_class(), dcgan_discriminator(), dcgan_generator(), kmp.wrap
    )
    (finding,) = [f for f in quiet_audit(gan) if JOIN in f.problem]
    assert finding.problem.startswith(
        "GAN.train_step joins generator's float16 output with the step's "
        "data (real_images, float32)"
    )
    assert "kmp.pin_float32(model.generator)" in finding.fix
    assert "keras.ops.concatenate" in finding.fix
    pinned = kmp.pin_float32(dcgan_generator())
    gan = compiled_gan(gan_class(), dcgan_discriminator(), pinned, kmp.wrap)
    assert not has(quiet_audit(gan), JOIN)
    # keras-io's Keras 3 rendering joins with keras.ops.concatenate,
    # which promotes: it trains under kmp.enable alone.
    gan = compiled_gan(
        keras3_gan_class(), dcgan_discriminator(), dcgan_generator(), kmp.wrap
    )
    assert not has(quiet_audit(gan), "joins")


def _new_findings(model):
    return [
        f.problem
        for f in quiet_audit(model)
        if any(p in f.problem for p in (IDS, "without dtype=", "joins"))
    ]


@independent
def test_no_such_finding_on_kmp_s_and_keras_io_s_other_models():
    kmp.enable("mixed_float16")
    models = [
        small_mlp(),
        keras_io_steps.custom_model(),
        keras_io_steps.gan(),
        vae_decoder(),
        kmp.pin_float32(text_classifier()),
        small_gpt2_backbone(),
    ]
    models.append(
        compiled_gan(
            keras3_gan_class(), dcgan_discriminator(), dcgan_generator()
        )
    )
    for model in models:
        assert _new_findings(model) == [], model.name
