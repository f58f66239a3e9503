"""Three keras-io examples whose own layers meet a 16-bit policy, written
as the examples write them (issue 39, part 2), so that kmp is tested on
code it did not write:

- "Variational AutoEncoder" (examples/generative/vae.py, last modified
  2024/04/24): `Sampling` draws `keras.random.normal(shape=(batch, dim))`,
  float32, and multiplies it with its float16 inputs; `VAE.train_step`
  uses a `tf.GradientTape`.
- "DCGAN to generate face images"
  (examples/generative/dcgan_overriding_train_step.py, 2021/01/01, the
  version the keras-io repository's `.py` holds): `GAN.train_step`
  concatenates the generator's output with the real images in
  `tf.concat`. keras-io's Keras 3 rendering of the same example
  (examples/generative/md/, 2023/12/21) concatenates with
  `keras.ops.concatenate`, which promotes: `Keras3GAN`.
- "Text classification with Transformer"
  (examples/nlp/text_classification_with_transformer.py, 2024/01/18):
  `layers.Input(shape=(maxlen,))` declares the token ids float32, and
  its `TokenAndPositionEmbedding` receives them.

Classes, layer calls and steps are copied as written (black's line
breaks at 80 columns; `super(GAN, self).__init__()` as `super()`, the
same call). What changed, and why:

- the data is synthetic, of the examples' shapes (28x28x1 digits in
  [0, 1], 64x64x3 images, ids of 200 tokens below 20,000), and small;
- the DCGAN's convolutions have 8-16 filters instead of 64-512 (the
  example's generator makes 64x64x512 maps, seconds a step on a CPU);
  the layers, kernels, strides and shapes are the example's;
- the VAE's encoder and decoder are the example's at full size (69k and
  65k weights); the transformer is the example's at full size;
- the examples run their data through `fit` with callbacks that plot or
  save images (DCGAN's `GANMonitor`), left out;
- `vae_encoder(sampling=...)` can put another class in `Sampling`'s
  place (the fixes kmp's line names, tried in tests); by default it is
  the example's.

The `VAE` and `GAN` steps use `tf.GradientTape` and run on TensorFlow
only, as written; on JAX and torch the tests run the layers and the
concatenation themselves.
"""

import keras
import numpy as np
from keras import layers
from keras import ops

from kmp import backend

# ---------------------------------------------------------------------------
# Variational AutoEncoder


class Sampling(layers.Layer):
    """Uses (z_mean, z_log_var) to sample z, the vector encoding a digit."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        batch = ops.shape(z_mean)[0]
        dim = ops.shape(z_mean)[1]
        epsilon = keras.random.normal(
            shape=(batch, dim), seed=self.seed_generator
        )
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


def vae_encoder(latent_dim=2, sampling=Sampling):
    """The example's encoder, built layer by layer (where a mixed
    policy's error first shows: at `Sampling()([z_mean, z_log_var])`);
    `sampling`: another class in `Sampling`'s place (a fix, in tests)."""
    encoder_inputs = keras.Input(shape=(28, 28, 1))
    x = layers.Conv2D(32, 3, activation="relu", strides=2, padding="same")(
        encoder_inputs
    )
    x = layers.Conv2D(64, 3, activation="relu", strides=2, padding="same")(x)
    x = layers.Flatten()(x)
    x = layers.Dense(16, activation="relu")(x)
    z_mean = layers.Dense(latent_dim, name="z_mean")(x)
    z_log_var = layers.Dense(latent_dim, name="z_log_var")(x)
    z = sampling()([z_mean, z_log_var])
    return keras.Model(encoder_inputs, [z_mean, z_log_var, z], name="encoder")


def vae_decoder(latent_dim=2):
    latent_inputs = keras.Input(shape=(latent_dim,))
    x = layers.Dense(7 * 7 * 64, activation="relu")(latent_inputs)
    x = layers.Reshape((7, 7, 64))(x)
    x = layers.Conv2DTranspose(
        64, 3, activation="relu", strides=2, padding="same"
    )(x)
    x = layers.Conv2DTranspose(
        32, 3, activation="relu", strides=2, padding="same"
    )(x)
    decoder_outputs = layers.Conv2DTranspose(
        1, 3, activation="sigmoid", padding="same"
    )(x)
    return keras.Model(latent_inputs, decoder_outputs, name="decoder")


def vae_class():
    """The example's `VAE` (its step imports TensorFlow)."""
    import tensorflow as tf

    class VAE(keras.Model):
        def __init__(self, encoder, decoder, **kwargs):
            super().__init__(**kwargs)
            self.encoder = encoder
            self.decoder = decoder
            self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
            self.reconstruction_loss_tracker = keras.metrics.Mean(
                name="reconstruction_loss"
            )
            self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

        @property
        def metrics(self):
            return [
                self.total_loss_tracker,
                self.reconstruction_loss_tracker,
                self.kl_loss_tracker,
            ]

        def train_step(self, data):
            with tf.GradientTape() as tape:
                z_mean, z_log_var, z = self.encoder(data)
                reconstruction = self.decoder(z)
                reconstruction_loss = ops.mean(
                    ops.sum(
                        keras.losses.binary_crossentropy(data, reconstruction),
                        axis=(1, 2),
                    )
                )
                kl_loss = -0.5 * (
                    1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var)
                )
                kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
                total_loss = reconstruction_loss + kl_loss
            grads = tape.gradient(total_loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
            self.total_loss_tracker.update_state(total_loss)
            self.reconstruction_loss_tracker.update_state(reconstruction_loss)
            self.kl_loss_tracker.update_state(kl_loss)
            return {
                "loss": self.total_loss_tracker.result(),
                "reconstruction_loss": (
                    self.reconstruction_loss_tracker.result()
                ),
                "kl_loss": self.kl_loss_tracker.result(),
            }

    return VAE


def mnist_digits(n=8, seed=0):
    """Digits of MNIST's shape, as the example scales them: float32 in
    [0, 1]."""
    rng = np.random.default_rng(seed)
    return rng.uniform(size=(n, 28, 28, 1)).astype("float32")


# ---------------------------------------------------------------------------
# DCGAN

LATENT_DIM = 128


def dcgan_discriminator():
    return keras.Sequential(
        [
            keras.Input(shape=(64, 64, 3)),
            layers.Conv2D(8, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(16, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(16, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Flatten(),
            layers.Dropout(0.2),
            layers.Dense(1, activation="sigmoid"),
        ],
        name="discriminator",
    )


def dcgan_generator(latent_dim=LATENT_DIM):
    return keras.Sequential(
        [
            keras.Input(shape=(latent_dim,)),
            layers.Dense(8 * 8 * 16),
            layers.Reshape((8, 8, 16)),
            layers.Conv2DTranspose(
                16, kernel_size=4, strides=2, padding="same"
            ),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2DTranspose(
                16, kernel_size=4, strides=2, padding="same"
            ),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2DTranspose(8, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(
                3, kernel_size=5, padding="same", activation="sigmoid"
            ),
        ],
        name="generator",
    )


def gan_class():
    """The example's `GAN`, as keras-io's `.py` holds it (`tf.concat`)."""
    import tensorflow as tf

    class GAN(keras.Model):
        def __init__(self, discriminator, generator, latent_dim):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.loss_fn = loss_fn
            self.d_loss_metric = keras.metrics.Mean(name="d_loss")
            self.g_loss_metric = keras.metrics.Mean(name="g_loss")

        @property
        def metrics(self):
            return [self.d_loss_metric, self.g_loss_metric]

        def train_step(self, real_images):
            # Sample random points in the latent space
            batch_size = tf.shape(real_images)[0]
            random_latent_vectors = tf.random.normal(
                shape=(batch_size, self.latent_dim)
            )

            # Decode them to fake images
            generated_images = self.generator(random_latent_vectors)

            # Combine them with real images
            combined_images = tf.concat([generated_images, real_images], axis=0)

            # Assemble labels discriminating real from fake images
            labels = tf.concat(
                [tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0
            )
            # Add random noise to the labels - important trick!
            labels += 0.05 * tf.random.uniform(tf.shape(labels))

            # Train the discriminator
            with tf.GradientTape() as tape:
                predictions = self.discriminator(combined_images)
                d_loss = self.loss_fn(labels, predictions)
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(
                zip(grads, self.discriminator.trainable_weights)
            )

            # Sample random points in the latent space
            random_latent_vectors = tf.random.normal(
                shape=(batch_size, self.latent_dim)
            )

            # Assemble labels that say "all real images"
            misleading_labels = tf.zeros((batch_size, 1))

            # Train the generator (note that we should *not* update the
            # weights of the discriminator)!
            with tf.GradientTape() as tape:
                predictions = self.discriminator(
                    self.generator(random_latent_vectors)
                )
                g_loss = self.loss_fn(misleading_labels, predictions)
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(
                zip(grads, self.generator.trainable_weights)
            )

            # Update metrics
            self.d_loss_metric.update_state(d_loss)
            self.g_loss_metric.update_state(g_loss)
            return {
                "d_loss": self.d_loss_metric.result(),
                "g_loss": self.g_loss_metric.result(),
            }

    return GAN


def keras3_gan_class():
    """The same example in keras-io's Keras 3 rendering: `keras.random`
    with a seed generator, `ops.concatenate`."""
    import tensorflow as tf

    class Keras3GAN(keras.Model):
        def __init__(self, discriminator, generator, latent_dim):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim
            self.seed_generator = keras.random.SeedGenerator(1337)

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.loss_fn = loss_fn
            self.d_loss_metric = keras.metrics.Mean(name="d_loss")
            self.g_loss_metric = keras.metrics.Mean(name="g_loss")

        @property
        def metrics(self):
            return [self.d_loss_metric, self.g_loss_metric]

        def train_step(self, real_images):
            # Sample random points in the latent space
            batch_size = ops.shape(real_images)[0]
            random_latent_vectors = keras.random.normal(
                shape=(batch_size, self.latent_dim), seed=self.seed_generator
            )

            # Decode them to fake images
            generated_images = self.generator(random_latent_vectors)

            # Combine them with real images
            combined_images = ops.concatenate(
                [generated_images, real_images], axis=0
            )

            # Assemble labels discriminating real from fake images
            labels = ops.concatenate(
                [ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))],
                axis=0,
            )
            # Add random noise to the labels - important trick!
            labels += 0.05 * tf.random.uniform(tf.shape(labels))

            # Train the discriminator
            with tf.GradientTape() as tape:
                predictions = self.discriminator(combined_images)
                d_loss = self.loss_fn(labels, predictions)
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(
                zip(grads, self.discriminator.trainable_weights)
            )

            # Sample random points in the latent space
            random_latent_vectors = keras.random.normal(
                shape=(batch_size, self.latent_dim), seed=self.seed_generator
            )

            # Assemble labels that say "all real images"
            misleading_labels = ops.zeros((batch_size, 1))

            # Train the generator (note that we should *not* update the
            # weights of the discriminator)!
            with tf.GradientTape() as tape:
                predictions = self.discriminator(
                    self.generator(random_latent_vectors)
                )
                g_loss = self.loss_fn(misleading_labels, predictions)
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(
                zip(grads, self.generator.trainable_weights)
            )

            # Update metrics
            self.d_loss_metric.update_state(d_loss)
            self.g_loss_metric.update_state(g_loss)
            return {
                "d_loss": self.d_loss_metric.result(),
                "g_loss": self.g_loss_metric.result(),
            }

    return Keras3GAN


def compiled_gan(cls, discriminator, generator, optimizer=None):
    """`cls` on the two networks, compiled as the example compiles it
    (`optimizer`: wraps each Adam, e.g. `kmp.wrap`)."""
    optimizer = optimizer or (lambda inner: inner)
    gan = cls(
        discriminator=discriminator, generator=generator, latent_dim=LATENT_DIM
    )
    gan.compile(
        d_optimizer=optimizer(keras.optimizers.Adam(learning_rate=0.0001)),
        g_optimizer=optimizer(keras.optimizers.Adam(learning_rate=0.0001)),
        loss_fn=keras.losses.BinaryCrossentropy(),
    )
    return gan


def face_images(n=4, seed=0):
    """Images of the example's CelebA shape, rescaled to [0, 1]."""
    rng = np.random.default_rng(seed)
    return rng.uniform(size=(n, 64, 64, 3)).astype("float32")


# ---------------------------------------------------------------------------
# Text classification with Transformer

VOCAB_SIZE = 20000  # Only consider the top 20k words
MAXLEN = 200  # Only consider the first 200 words of each movie review


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(
            num_heads=num_heads, key_dim=embed_dim
        )
        self.ffn = keras.Sequential(
            [
                layers.Dense(ff_dim, activation="relu"),
                layers.Dense(embed_dim),
            ]
        )
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output)
        return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(
            input_dim=vocab_size, output_dim=embed_dim
        )
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions


def text_classifier(maxlen=MAXLEN, vocab_size=VOCAB_SIZE, seed=0):
    """The example's classifier, uncompiled."""
    keras.utils.set_random_seed(seed)
    embed_dim = 32  # Embedding size for each token
    num_heads = 2  # Number of attention heads
    ff_dim = 32  # Hidden layer size in feed forward network inside transformer

    inputs = layers.Input(shape=(maxlen,))
    embedding_layer = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)
    x = embedding_layer(inputs)
    transformer_block = TransformerBlock(embed_dim, num_heads, ff_dim)
    x = transformer_block(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dropout(0.1)(x)
    x = layers.Dense(20, activation="relu")(x)
    x = layers.Dropout(0.1)(x)
    outputs = layers.Dense(2, activation="softmax")(x)

    return keras.Model(inputs=inputs, outputs=outputs)


def reviews(n=8, maxlen=MAXLEN, vocab_size=VOCAB_SIZE, seed=0):
    """Padded id sequences and 0/1 labels, as the example's IMDB arrays
    (int32 ids, as `pad_sequences` gives them), each with ids past 2048."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocab_size, size=(n, maxlen)).astype("int32")
    x[:, 0] = vocab_size - 1  # 19999: float16 rounds it to 20000
    return x, (np.arange(n) % 2).astype("int32")


def jax_cpu():
    """Whether JAX runs here on a CPU, whose `dot_general` has no
    float16 x float16 -> float32 (Keras's fused float16 attention)."""
    if backend.name() != "jax":
        return False
    import jax

    return jax.devices()[0].platform == "cpu"
