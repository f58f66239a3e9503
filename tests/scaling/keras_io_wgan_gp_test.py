"""keras-io's "WGAN-GP overriding `Model.train_step`"
(examples/generative/wgan_gp.py) under kmp, on TensorFlow only (its
step uses `tf.GradientTape`, as written).

Its discriminator loss holds a gradient penalty: the norm of the
critic's gradient by interpolated images, taken by a tape inside the
step's tape, so the discriminator's update differentiates twice. Under
mixed_float16 the inner gradient is of the critic's output, unscaled,
and the outer one of the loss the user may scale. The `WGAN` class is
copied as written (`super(WGAN, self)` as `super()`, the same call);
what changed: the networks are small (a convolution and a dense layer
on 8x8 images, where the example's are four and three blocks on 28x28),
without the critic's Dropout (Keras draws a mask's uniform numbers in
the layer's compute dtype, so float16 and float32 runs would drop other
units and not compare), the data synthetic, and `scale=True` adds the
one line a user adds to scale the discriminator's loss,
`self.d_optimizer.scale_loss(d_loss)`.
"""

import keras
import numpy as np
from keras import layers
from util import tf_only

import kmp

IMG_SHAPE = (8, 8, 1)
NOISE_DIM = 16
STEPS = 3
BATCH = 8


def _wgan_class(scale):
    import tensorflow as tf

    class WGAN(keras.Model):
        def __init__(
            self,
            discriminator,
            generator,
            latent_dim,
            discriminator_extra_steps=3,
            gp_weight=10.0,
        ):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim
            self.d_steps = discriminator_extra_steps
            self.gp_weight = gp_weight

        def compile(self, d_optimizer, g_optimizer, d_loss_fn, g_loss_fn):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.d_loss_fn = d_loss_fn
            self.g_loss_fn = g_loss_fn

        def gradient_penalty(self, batch_size, real_images, fake_images):
            """Calculates the gradient penalty.

            This loss is calculated on an interpolated image
            and added to the discriminator loss.
            """
            # Get the interpolated image
            alpha = tf.random.normal([batch_size, 1, 1, 1], 0.0, 1.0)
            diff = fake_images - real_images
            interpolated = real_images + alpha * diff

            with tf.GradientTape() as gp_tape:
                gp_tape.watch(interpolated)
                # 1. Get the discriminator output for this interpolated image.
                pred = self.discriminator(interpolated, training=True)

            # 2. Calculate the gradients w.r.t to this interpolated image.
            grads = gp_tape.gradient(pred, [interpolated])[0]
            # 3. Calculate the norm of the gradients.
            norm = tf.sqrt(tf.reduce_sum(tf.square(grads), axis=[1, 2, 3]))
            gp = tf.reduce_mean((norm - 1.0) ** 2)
            return gp

        def train_step(self, real_images):
            if isinstance(real_images, tuple):
                real_images = real_images[0]

            # Get the batch size
            batch_size = tf.shape(real_images)[0]

            for i in range(self.d_steps):  # noqa: B007
                # Get the latent vector
                random_latent_vectors = tf.random.normal(
                    shape=(batch_size, self.latent_dim)
                )
                with tf.GradientTape() as tape:
                    # Generate fake images from the latent vector
                    fake_images = self.generator(
                        random_latent_vectors, training=True
                    )
                    # Get the logits for the fake images
                    fake_logits = self.discriminator(fake_images, training=True)
                    # Get the logits for the real images
                    real_logits = self.discriminator(real_images, training=True)

                    # Calculate the discriminator loss using the fake and
                    # real image logits
                    d_cost = self.d_loss_fn(
                        real_img=real_logits, fake_img=fake_logits
                    )
                    # Calculate the gradient penalty
                    gp = self.gradient_penalty(
                        batch_size, real_images, fake_images
                    )
                    # Add the gradient penalty to the original
                    # discriminator loss
                    d_loss = d_cost + gp * self.gp_weight
                    if scale:  # the user's one line
                        d_loss_of_tape = self.d_optimizer.scale_loss(d_loss)
                    else:
                        d_loss_of_tape = d_loss

                # Get the gradients w.r.t the discriminator loss
                d_gradient = tape.gradient(
                    d_loss_of_tape, self.discriminator.trainable_variables
                )
                # Update the weights of the discriminator using the
                # discriminator optimizer
                self.d_optimizer.apply_gradients(
                    zip(d_gradient, self.discriminator.trainable_variables)
                )

            # Train the generator
            # Get the latent vector
            random_latent_vectors = tf.random.normal(
                shape=(batch_size, self.latent_dim)
            )
            with tf.GradientTape() as tape:
                # Generate fake images using the generator
                generated_images = self.generator(
                    random_latent_vectors, training=True
                )
                # Get the discriminator logits for fake images
                gen_img_logits = self.discriminator(
                    generated_images, training=True
                )
                # Calculate the generator loss
                g_loss = self.g_loss_fn(gen_img_logits)

            # Get the gradients w.r.t the generator loss
            gen_gradient = tape.gradient(
                g_loss, self.generator.trainable_variables
            )
            # Update the weights of the generator using the generator
            # optimizer
            self.g_optimizer.apply_gradients(
                zip(gen_gradient, self.generator.trainable_variables)
            )
            return {"d_loss": d_loss, "g_loss": g_loss}

    return WGAN


def discriminator_loss(real_img, fake_img):
    import tensorflow as tf

    real_loss = tf.reduce_mean(real_img)
    fake_loss = tf.reduce_mean(fake_img)
    return fake_loss - real_loss


def generator_loss(fake_img):
    import tensorflow as tf

    return -tf.reduce_mean(fake_img)


def _networks():
    """The critic and the generator, smaller; float32 outputs, as the
    example's `fake_images - real_images` (TensorFlow's `Sub`, which does
    not promote) needs under mixed_float16 (kmp's dtype line names
    `kmp.pin_float32(self.generator)`)."""
    critic = keras.Sequential(
        [
            keras.Input(shape=IMG_SHAPE),
            layers.Conv2D(8, (5, 5), strides=(2, 2), padding="same"),
            layers.LeakyReLU(0.2),
            layers.Flatten(),
            layers.Dense(1),
        ],
        name="discriminator",
    )
    generator = keras.Sequential(
        [
            keras.Input(shape=(NOISE_DIM,)),
            layers.Dense(4 * 4 * 8, use_bias=False),
            layers.BatchNormalization(),
            layers.LeakyReLU(0.2),
            layers.Reshape((4, 4, 8)),
            layers.UpSampling2D((2, 2)),
            layers.Conv2D(1, (3, 3), padding="same", use_bias=False),
            layers.Activation("tanh"),
        ],
        name="generator",
    )
    return kmp.pin_float32(critic), kmp.pin_float32(generator)


def _fit(policy, scale=False, optimizer="adam"):
    """Fits the WGAN for `STEPS` steps eagerly (so every policy draws the
    same random numbers), with the example's Adam or with SGD; its
    per-step logs and LossScaleMonitor's."""
    kmp.enable(policy)
    keras.utils.set_random_seed(0)
    critic, generator = _networks()
    wgan = _wgan_class(scale)(
        discriminator=critic, generator=generator, latent_dim=NOISE_DIM
    )

    def wrapped():
        if optimizer == "sgd":
            return kmp.wrap(keras.optimizers.SGD(learning_rate=0.01))
        return kmp.wrap(
            keras.optimizers.Adam(learning_rate=0.0002, beta_1=0.5, beta_2=0.9)
        )

    wgan.compile(
        d_optimizer=wrapped(),
        g_optimizer=wrapped(),
        g_loss_fn=generator_loss,
        d_loss_fn=discriminator_loss,
    )
    wgan.run_eagerly = True
    images = np.random.default_rng(0).uniform(
        -1, 1, size=(STEPS * BATCH, *IMG_SHAPE)
    )
    steps = []
    log = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: steps.append(dict(logs))
    )
    monitor = kmp.callbacks.LossScaleMonitor()
    wgan.fit(
        images.astype("float32"),
        batch_size=BATCH,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[monitor, log],
    )
    return wgan, steps, monitor.history


def _losses(steps):
    return {
        name: [float(step[name]) for step in steps]
        for name in ("d_loss", "g_loss")
    }


def _assert_close(steps, reference):
    for name, values in _losses(steps).items():
        np.testing.assert_allclose(
            values, _losses(reference)[name], rtol=2e-3, atol=1e-4
        )


@tf_only
def test_the_wgan_gp_as_written_trains_under_kmp_as_under_float32(caplog):
    _, reference, _ = _fit("float32")
    wgan, steps, monitored = _fit("mixed_float16")
    _assert_close(steps, reference)
    # The step as written never scales: kmp applies its gradients as they
    # are (3 critic updates and 1 generator update a step) and says so.
    assert int(wgan.d_optimizer.iterations) == 3 * STEPS
    assert int(wgan.g_optimizer.iterations) == STEPS
    assert "self.d_optimizer did not scale" in caplog.text
    assert monitored["d_loss_scale"] == [2.0**15] * STEPS


@tf_only
def test_the_wgan_gp_with_its_loss_scaled_unscales_the_penalty_s_gradients():
    # The scaled loss differentiates the penalty's inner gradient too, and
    # kmp divides the critic's gradients by the scale: SGD's updates (which,
    # unlike Adam's, would be 32768x too large otherwise) are float32's.
    _, reference, _ = _fit("float32", optimizer="sgd")
    wgan, steps, monitored = _fit("mixed_float16", scale=True, optimizer="sgd")
    _assert_close(steps, reference)
    assert int(wgan.d_optimizer.skipped_steps) == 0
    assert int(wgan.d_optimizer.iterations) == 3 * STEPS
    assert monitored["d_loss_scale"] == [2.0**15] * STEPS
