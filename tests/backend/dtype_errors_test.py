"""kmp's line at the end of an error where a user's layer or train step
mixes 16-bit and float32 tensors (`kmp.backend.dtype_errors`): on
keras-io's VAE and DCGAN as written (`keras_io_models`, TensorFlow, the
backend whose ops refuse to mix), and on each backend's own refusals.
"""

import keras
import numpy as np
import pytest
from keras_io_models import LATENT_DIM
from keras_io_models import Sampling
from keras_io_models import compiled_gan
from keras_io_models import dcgan_discriminator
from keras_io_models import dcgan_generator
from keras_io_models import face_images
from keras_io_models import gan_class
from keras_io_models import mnist_digits
from keras_io_models import vae_class
from keras_io_models import vae_decoder
from keras_io_models import vae_encoder

import kmp
from kmp import backend

TENSORFLOW = backend.name() == "tensorflow"
tensorflow_only = pytest.mark.skipif(
    not TENSORFLOW,
    reason="keras-io's step uses tf.GradientTape; JAX and torch promote "
    "float16 * float32 (tests/auditing/dtype_checks_test.py)",
)


@pytest.fixture(autouse=True)
def _notes_off_after():
    yield
    kmp.disable()  # the line off; conftest then restores the policy


def _refuse(x):
    """An op of the running framework that refuses float16 with float32
    (Keras's own ops would promote)."""
    if backend.name() == "tensorflow":
        import tensorflow as tf

        return tf.concat([x, tf.ones_like(x, dtype="float32")], 0)
    if backend.name() == "torch":
        import torch

        return torch.matmul(x, torch.ones_like(x, dtype=torch.float32).T)
    import jax

    return jax.lax.add(x, jax.numpy.ones(x.shape, "float32"))


class Inner(keras.layers.Layer):
    def call(self, x):
        return _refuse(x)


class Outer(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(4)
        self.inner = Inner(name="inner")

    def call(self, x):
        return self.inner(self.dense(x))


def _raised(call):
    with pytest.raises(Exception) as caught:
        call()
    return caught.value


def _kmp_notes(error):
    return [n for n in getattr(error, "__notes__", ()) if n.startswith("kmp")]


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_each_framework_s_refusal_is_read(half):
    x = keras.ops.ones((2, 2), dtype=half)
    error = _raised(lambda: _refuse(x))
    assert backend.mismatched_dtypes(error) == (half, "float32")
    if TENSORFLOW:
        import tensorflow as tf

        traced = _raised(lambda: tf.function(_refuse, autograph=False)(x))
        assert backend.mismatched_dtypes(traced) == (half, "float32")
        product = _raised(lambda: x * tf.ones((2, 2), "float32"))
        assert backend.mismatched_dtypes(product) == (half, "float32")
        # keras-io's diffusion example: `... / feature_dimensions`.
        quotient = _raised(lambda: x / tf.ones((2, 2), "float32"))
        assert backend.mismatched_dtypes(quotient) == (half, "float32")
    # Errors that name dtypes without a mismatch are not read as one.
    shape = _raised(lambda: keras.ops.reshape(x, (3,)))
    assert backend.mismatched_dtypes(shape) is None
    assert backend.mismatched_dtypes(ValueError("float16 and float32")) is None


@pytest.mark.filterwarnings("ignore:Layer .o2. looks like it has unbuilt state")
def test_the_line_names_the_innermost_user_layer_once():
    kmp.enable("mixed_float16")
    error = _raised(lambda: Outer(name="outer")(np.ones((2, 4), "float32")))
    (line,) = _kmp_notes(error)
    assert line.startswith("kmp: Inner 'inner' computes in float16")
    assert "mixed float16 with float32" in line
    assert "kmp.pin_float32(model, also=[Inner])" in line
    if backend.name() != "torch":  # torch's meta tensors do not refuse
        error = _raised(lambda: Outer(name="o2")(keras.Input((4,))))
        assert len(_kmp_notes(error)) == 1
        assert "Inner 'inner'" in _kmp_notes(error)[0]


def test_a_lambda_s_function_is_named_with_the_lambda_s_fixes():
    # keras-io's diffusion model: a Lambda's function (its sinusoidal
    # embedding) mixes a float32 constant with its 16-bit input. The line
    # named the model's method and pins that do not help.
    def embed(x):
        return _refuse(x)

    kmp.enable("mixed_float16")
    inputs = keras.Input((2,))
    lambda_layer = keras.layers.Lambda(embed, output_shape=(2,), name="sin")
    model = keras.Model(inputs, keras.layers.Dense(2)(lambda_layer(inputs)))
    (line,) = _kmp_notes(_raised(lambda: model(np.ones((2, 2), "float32"))))
    assert line.startswith(
        "kmp: Lambda 'sin' computes in float16 (mixed_float16) and its "
        "function embed mixed float16 with float32: cast one side inside it"
    )
    assert "Lambda(embed, ..., dtype='float32')" in line
    kmp.pin_float32(model, also=["sin"])  # the fix it names
    model(np.ones((2, 2), "float32"))  # no error


def test_other_errors_and_other_code_get_no_line():
    kmp.enable("mixed_float16")
    mismatch = TypeError(
        "Input 'y' of 'Mul' Op has type float32 that does not match type "
        "float16 of argument 'x'."
    )
    # Keras's layer, no frame of the user's: not the user's to fix.
    assert backend.dtype_note(mismatch, keras.layers.Dense(2)) is None
    # A user's layer in float32 under a float32 policy.
    keras.config.set_dtype_policy("float32")
    assert backend.dtype_note(mismatch, Inner(dtype="float32")) is None
    # Another error in a user's layer under a 16-bit policy.
    kmp.enable("mixed_float16")

    class Reshapes(keras.layers.Layer):
        def call(self, x):
            return keras.ops.reshape(x, (7,))

    assert not _kmp_notes(_raised(lambda: Reshapes()(np.ones((2, 2)))))


class ActivityRegularizationLayer(keras.layers.Layer):
    """keras-io's guide "Making new layers and models via subclassing",
    as it writes the layer (`cast=True`: with the fix kmp's line names)."""

    def __init__(self, rate=1e-2, cast=False):
        super().__init__()
        self.rate = rate
        self.cast = cast

    def call(self, inputs):
        loss = self.rate * keras.ops.mean(inputs)
        self.add_loss(keras.ops.cast(loss, "float32") if self.cast else loss)
        return inputs


@pytest.mark.parametrize("fixed", [False, True], ids=["as written", "cast"])
def test_a_float16_add_loss_in_fit(fixed):
    # Keras sums the add_loss losses with the compiled loss as they are:
    # TensorFlow refuses float16 with float32 there, in Keras's frames.
    kmp.enable("mixed_float16")
    inputs = keras.Input((3,))
    hidden = ActivityRegularizationLayer(cast=fixed)(
        keras.layers.Dense(8)(inputs)
    )
    model = kmp.pin_float32(keras.Model(inputs, keras.layers.Dense(1)(hidden)))
    model.compile(optimizer=kmp.wrap("sgd"), loss="mse")

    def fit():
        return model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0)

    if TENSORFLOW and not fixed:
        error = _raised(fit)
        assert backend.mismatched_dtypes(error) == ("float16", "float32")
        (line,) = _kmp_notes(error)
        assert line.startswith("kmp: the step summed a float16 loss")
        assert "add_loss" in line
        assert "self.add_loss(keras.ops.cast(loss, 'float32'))" in line
    else:  # JAX and torch promote the list; the cast needs no promotion
        assert np.isfinite(fit().history["loss"][0])


def test_the_losses_line_only_from_a_step_under_a_16_bit_policy():
    def listed():
        return TypeError(
            "Cannot convert a list containing a tensor of dtype <dtype: "
            "'float16'> to <dtype: 'float32'> (Tensor is: <tf.Tensor "
            "'Sum:0' shape=() dtype=float16>)"
        )

    kmp.enable("mixed_float16")
    assert "add_loss" in backend.dtype_note(listed())
    # Raised in a layer of Keras's, not the user's: that layer's error.
    assert backend.dtype_note(listed(), keras.layers.Dense(2)) is None
    kmp.disable()
    assert backend.dtype_note(listed()) is None


def test_jax_cpu_s_16_bit_matmul_refusal_gets_the_line():
    def refused(precision):
        return ValueError(
            f"The precision '{precision}' is not supported by dot_general "
            "on CPU"
        )

    kmp.enable("mixed_float16")
    line = backend.dtype_note(refused("F16_F16_F32"))
    assert line.startswith("kmp: JAX on a CPU has no float16 matmul")
    assert line.endswith(
        "(kmp.enable('auto') picks it there) or mixed_bfloat16."
    )
    line = backend.dtype_note(refused("BF16_BF16_F32"))
    assert "no bfloat16 matmul" in line and "or mixed_bfloat16" not in line
    assert backend.dtype_note(refused("F32_F32_F32")) is None


@pytest.mark.skipif(backend.name() != "jax", reason="JAX's CPU backend")
def test_float16_attention_on_jax_s_cpu_ends_with_kmp_s_line():
    import jax

    if jax.devices()[0].platform != "cpu":
        pytest.skip("a GPU has the float16 matmul")
    kmp.enable("mixed_float16")
    query = keras.Input((6, 8))
    attended = keras.layers.MultiHeadAttention(2, 8)(query, query)
    model = kmp.pin_float32(keras.Model(query, keras.layers.Dense(2)(attended)))
    model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
    error = _raised(
        lambda: model.fit(np.ones((2, 6, 8)), np.ones((2, 6, 2)), verbose=0)
    )
    (line,) = _kmp_notes(error)
    assert line.startswith("kmp: JAX on a CPU has no float16 matmul")


class DrawsInItsDtype(Sampling):
    """keras-io's Sampling with the fix kmp's line names first."""

    def call(self, inputs):
        z_mean, z_log_var = inputs
        batch = keras.ops.shape(z_mean)[0]
        dim = keras.ops.shape(z_mean)[1]
        epsilon = keras.random.normal(
            shape=(batch, dim),
            seed=self.seed_generator,
            dtype=self.compute_dtype,
        )
        return z_mean + keras.ops.exp(0.5 * z_log_var) * epsilon


@tensorflow_only
@pytest.mark.parametrize(
    "policy", ["mixed_float16", "mixed_bfloat16", "bfloat16"]
)
def test_keras_io_s_vae_error_ends_with_kmp_s_line(policy):
    # Issue 39: Sampling's float32 draw meets its 16-bit inputs while
    # the encoder is built (TensorFlow traces call() for the output spec).
    kmp.enable(keras.DTypePolicy(policy))
    half = keras.config.dtype_policy().compute_dtype
    error = _raised(vae_encoder)
    (line,) = _kmp_notes(error)
    assert line == error.__notes__[-1]  # the error ends with it
    assert line.startswith(f"kmp: Sampling 'sampling' computes in {half}")
    assert f"mixed {half} with float32" in line
    assert "dtype=self.compute_dtype" in line
    # The error stops the Functional model's build: no model for
    # `also=` to reach, so the line says the layer's own dtype.
    assert "Sampling(..., dtype='float32'), where you make it" in line
    assert "also=['sampling']" not in line
    # Type and message as Keras raises them without kmp (its policy set
    # by Keras, the names started again).
    kmp.disable()
    keras.utils.clear_session(free_memory=False)
    keras.config.set_dtype_policy(policy)
    bare = _raised(vae_encoder)
    assert type(bare) is type(error) is TypeError
    assert str(bare) == str(error)
    assert not getattr(bare, "__notes__", None)
    if policy == "mixed_float16":
        _the_fixes_named_work()


def _the_fixes_named_work():
    """keras-io's VAE builds and trains with the line's first fix (the
    draw in the layer's dtype), and builds with its second (the layer in
    float32)."""
    kmp.enable("mixed_float16")
    vae_encoder(sampling=lambda: Sampling(dtype="float32"))
    vae = vae_class()(vae_encoder(sampling=DrawsInItsDtype), vae_decoder())
    vae.compile(optimizer=kmp.wrap(keras.optimizers.Adam()))
    vae.run_eagerly = True  # seconds less than tracing, the same step
    logs = vae.fit(mnist_digits(4), batch_size=2, verbose=0).history
    assert np.isfinite(logs["loss"][-1])


@tensorflow_only
def test_keras_io_s_sampling_called_eagerly_and_traced_gets_the_line():
    kmp.enable("mixed_float16")
    z = np.zeros((2, 2), "float16")
    eager = _raised(lambda: Sampling(name="eager")([z, z]))
    assert "Sampling 'eager'" in _kmp_notes(eager)[0]

    class Encoder(keras.Model):  # Sampling inside a subclassed model
        def __init__(self):
            super().__init__()
            self.mean = keras.layers.Dense(2)
            self.log_var = keras.layers.Dense(2)
            self.sampling = Sampling(name="traced")
            self.out = keras.layers.Dense(1, dtype="float32")

        def call(self, x):
            return self.out(self.sampling([self.mean(x), self.log_var(x)]))

    model = Encoder()
    model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
    x = np.ones((4, 3), "float32")
    traced = _raised(lambda: model.fit(x, x[:, :1], verbose=0))
    (line,) = _kmp_notes(traced)
    assert "Sampling 'traced'" in line
    # A subclassed model holds its layers before its build: the line's
    # `also=` reaches the layer, and the model trains.
    # By class: every Sampling runs the code that failed.
    assert "kmp.pin_float32(model, also=[Sampling])" in line
    model = kmp.pin_float32(Encoder(), also=[Sampling])
    model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
    logs = model.fit(x, x[:, :1], verbose=0).history
    assert np.isfinite(logs["loss"][-1])


@tensorflow_only
def test_keras_io_s_dcgan_step_error_ends_with_kmp_s_line():
    # The example as its .py writes it: tf.concat of the generator's
    # float16 images and the float32 real ones, in train_step.
    kmp.enable("mixed_float16")
    images = face_images()
    gan = compiled_gan(
        gan_class(), dcgan_discriminator(), dcgan_generator(), kmp.wrap
    )
    error = _raised(lambda: gan.fit(images, batch_size=2, verbose=0))
    assert type(error) is TypeError and "ConcatV2" in str(error)
    (line,) = _kmp_notes(error)
    assert line.startswith("kmp: GAN.train_step runs under mixed_float16")
    assert "mixed float16 with float32" in line
    assert "kmp.pin_float32(self.generator)" in line
    # The fix the line names: the generator's output in float32.
    generator = kmp.pin_float32(dcgan_generator())
    assert generator(np.zeros((1, LATENT_DIM))).dtype == "float32"
    gan = compiled_gan(gan_class(), dcgan_discriminator(), generator, kmp.wrap)
    logs = gan.fit(images, batch_size=2, verbose=0).history
    assert np.isfinite(logs["d_loss"][-1]) and np.isfinite(logs["g_loss"][-1])


@tensorflow_only
def test_a_step_s_helper_meeting_a_sub_model_s_output_names_the_sub_model():
    # keras-io's WGAN-GP: `fake_images - real_images` in its
    # `gradient_penalty`, the generator's images float16. Running the
    # WGAN itself in float32 (the layer line's fix) would not change them.
    import tensorflow as tf

    class WGAN(keras.Model):
        def __init__(self, generator):
            super().__init__(name="wgan")
            self.generator = generator

        def gradient_penalty(self, real_images):
            fake_images = self.generator(real_images)
            return tf.reduce_mean(fake_images - real_images)

        def train_step(self, real_images):
            return {"gp": self.gradient_penalty(real_images)}

    def fit(generator):
        wgan = WGAN(generator)
        wgan.compile()
        return wgan.fit(np.ones((4, 4), "float32"), verbose=0).history

    def generator():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(4)])

    kmp.enable("mixed_float16")
    error = _raised(lambda: fit(generator()))
    (line,) = _kmp_notes(error)
    assert line.startswith(
        "kmp: WGAN.gradient_penalty runs under mixed_float16"
    )
    assert "kmp.pin_float32(self.generator)" in line
    assert "dtype='float32'" not in line
    # The fix the line names.
    assert np.isfinite(fit(kmp.pin_float32(generator()))["gp"][-1])


class FNetLayer(keras.layers.Layer):
    """keras-io's FNet's mixing layer: an FFT of its input."""

    def call(self, inputs):
        real = keras.ops.fft2((inputs, keras.ops.zeros_like(inputs)))[0]
        return real + inputs


@pytest.mark.skipif(
    backend.name() == "torch", reason="torch makes complex halves"
)
def test_an_fft_of_a_16_bit_input_ends_with_kmp_s_line():
    # TensorFlow and JAX have no 16-bit complex numbers: the FFT refuses
    # the float16 input, in stock Keras too, and kmp said nothing.
    kmp.enable("mixed_float16")
    inputs = keras.Input((8, 16))
    error = _raised(lambda: FNetLayer(name="fnet")(inputs))
    (line,) = _kmp_notes(error)
    assert line.startswith(
        "kmp: FNetLayer 'fnet' computes in float16 (mixed_float16) and "
        "passed float16 to an op that has no 16-bit form"
    )
    assert "FNetLayer(..., dtype='float32'), where you make it" in line
    # The line's fix: the layer in float32 builds.
    FNetLayer(dtype="float32")(inputs)


def _mixing_spectrum(x):
    return keras.ops.fft2((x, keras.ops.zeros_like(x)))[0] + x


@pytest.mark.skipif(
    backend.name() == "torch", reason="torch makes complex halves"
)
def test_a_lambda_whose_shape_keras_failed_to_infer_ends_with_kmp_s_line():
    # Keras's bare `except` drops the FFT's own error and says only that
    # it could not infer the Lambda's output shape.
    kmp.enable("mixed_float16")
    inputs = keras.Input((8, 16))
    error = _raised(lambda: keras.layers.Lambda(_mixing_spectrum)(inputs))
    assert type(error) is NotImplementedError
    (line,) = _kmp_notes(error)
    assert (
        line.startswith("kmp: Lambda 'lambda")
        and "Keras ran _mixing_spectrum on float16 inputs" in line
    )
    assert line.endswith("Lambda(_mixing_spectrum, ..., dtype='float32').")
    keras.layers.Lambda(_mixing_spectrum, dtype="float32")(inputs)  # the fix
