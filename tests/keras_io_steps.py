"""The train steps keras-io's guides teach, written as the guides write
them ("Customizing what happens in `fit()`" with TensorFlow, with JAX and
with PyTorch, and the GAN at the end of the TensorFlow and PyTorch ones),
so that kmp is tested on code it did not write.

`custom_model(scale=False)` and `gan(scale=False)` give the running
backend's version. With `scale=True` each adds the one line kmp's
message asks for (`loss = optimizer.scale_loss(loss)` before the
gradients) and changes nothing else; the line is `_scaling`'s, outside
the classes, whose source then never names the scaling (the audit reads
it: `tests/auditing/optimizer_checks_test.py`).
"""

import keras
import numpy as np

from kmp import backend


def _scaling(optimizer, scale, optimizer_variables=None):
    """The line kmp's message asks for, or nothing: `loss ->
    optimizer.scale_loss(loss)` (the stateless form given the step's
    `optimizer_variables`), or `loss -> loss`."""
    if not scale:
        return lambda loss: loss
    if optimizer_variables is not None:
        return lambda loss: optimizer.stateless_scale_loss(
            optimizer_variables, loss
        )
    return optimizer.scale_loss


def _tensorflow_model(scale):
    import tensorflow as tf

    class CustomModel(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)  # Forward pass
                # Compute the loss value
                # (the loss function is configured in `compile()`)
                loss = self.compute_loss(y=y, y_pred=y_pred)
                loss = _scaling(self.optimizer, scale)(loss)

            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)

            # Update weights
            self.optimizer.apply(gradients, trainable_vars)

            # Update metrics (includes the metric that tracks the loss)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)

            # Return a dict mapping metric names to current value
            return {m.name: m.result() for m in self.metrics}

    return CustomModel


def _jax_model(scale):
    import jax

    class CustomModel(keras.Model):
        def compute_loss_and_updates(
            self,
            trainable_variables,
            non_trainable_variables,
            optimizer_variables,
            x,
            y,
            training=False,
        ):
            y_pred, non_trainable_variables = self.stateless_call(
                trainable_variables,
                non_trainable_variables,
                x,
                training=training,
            )
            loss = self.compute_loss(x, y, y_pred)
            # The stateless form: the scale of this step's state.
            loss = _scaling(self.optimizer, scale, optimizer_variables)(loss)
            return loss, (y_pred, non_trainable_variables)

        def train_step(self, state, data):
            (
                trainable_variables,
                non_trainable_variables,
                optimizer_variables,
                metrics_variables,
            ) = state
            x, y = data

            # Get the gradient function.
            grad_fn = jax.value_and_grad(
                self.compute_loss_and_updates, has_aux=True
            )

            # Compute the gradients.
            (loss, (y_pred, non_trainable_variables)), grads = grad_fn(
                trainable_variables,
                non_trainable_variables,
                optimizer_variables,
                x,
                y,
                training=True,
            )

            # Update trainable variables and optimizer variables.
            (
                trainable_variables,
                optimizer_variables,
            ) = self.optimizer.stateless_apply(
                optimizer_variables, grads, trainable_variables
            )

            # Update metrics.
            new_metrics_vars = []
            logs = {}
            for metric in self.metrics:
                this_metric_vars = metrics_variables[
                    len(new_metrics_vars) : len(new_metrics_vars)
                    + len(metric.variables)
                ]
                if metric.name == "loss":
                    this_metric_vars = metric.stateless_update_state(
                        this_metric_vars, loss
                    )
                else:
                    this_metric_vars = metric.stateless_update_state(
                        this_metric_vars, y, y_pred
                    )
                logs[metric.name] = metric.stateless_result(this_metric_vars)
                new_metrics_vars += this_metric_vars

            # Return metric logs and updated state variables.
            state = (
                trainable_variables,
                non_trainable_variables,
                optimizer_variables,
                new_metrics_vars,
            )
            return logs, state

    return CustomModel


def _torch_model(scale):
    import torch

    class CustomModel(keras.Model):
        def train_step(self, data):
            x, y = data

            # Call torch.nn.Module.zero_grad() to clear the leftover
            # gradients for the weights from the previous train step.
            self.zero_grad()

            # Compute loss
            y_pred = self(x, training=True)  # Forward pass
            loss = self.compute_loss(y=y, y_pred=y_pred)
            loss = _scaling(self.optimizer, scale)(loss)

            # Call torch.Tensor.backward() on the loss to compute
            # gradients for the weights.
            loss.backward()

            trainable_weights = [v for v in self.trainable_weights]
            gradients = [v.value.grad for v in trainable_weights]

            # Update weights
            with torch.no_grad():
                self.optimizer.apply(gradients, trainable_weights)

            # Update metrics (includes the metric that tracks the loss)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)

            # Return a dict mapping metric names to current value
            # Note that it will include the loss (tracked in self.metrics).
            return {m.name: m.result() for m in self.metrics}

    return CustomModel


def custom_model_class(scale=False):
    """The guide's `CustomModel` for the running backend."""
    makers = {
        "tensorflow": _tensorflow_model,
        "jax": _jax_model,
        "torch": _torch_model,
    }
    return makers[backend.name()](scale)


def custom_model(scale=False, features=8, seed=0, cls=None):
    """The guide's model: `CustomModel(inputs, outputs)`, uncompiled
    (`cls`: another `keras.Model` class, on the same layers and
    weights)."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input(shape=(features,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    outputs = keras.layers.Dense(1, dtype="float32")(hidden)
    return (cls or custom_model_class(scale))(inputs, outputs)


def _gan_class(scale):
    """The GAN at the end of the TensorFlow and PyTorch guides (the JAX
    guide has none); the two backends' lines where they differ."""
    torch_backend = backend.name() == "torch"
    if torch_backend:
        import torch
    else:
        import tensorflow as tf

    def gradients_of(loss, weights, tape):
        if torch_backend:
            loss.backward()
            return [v.value.grad for v in weights]
        return tape.gradient(loss, weights)

    class GAN(keras.Model):
        def __init__(self, discriminator, generator, latent_dim):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim
            self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
            self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
            self.seed_generator = keras.random.SeedGenerator(1337)
            self.built = True  # as the PyTorch guide does: no call()

        @property
        def metrics(self):
            return [self.d_loss_tracker, self.g_loss_tracker]

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.loss_fn = loss_fn

        def _step(self, optimizer, loss_of, weights):
            # One optimizer's half of the guide's step: its loss, its
            # gradients (a tape on TensorFlow, backward() on torch), its
            # apply.
            if torch_backend:
                self.zero_grad()
                loss = _scaling(optimizer, scale)(loss_of())
                grads = gradients_of(loss, weights, None)
                with torch.no_grad():
                    optimizer.apply(grads, weights)
                return loss
            with tf.GradientTape() as tape:
                loss = _scaling(optimizer, scale)(loss_of())
            grads = gradients_of(loss, weights, tape)
            optimizer.apply(grads, weights)
            return loss

        def train_step(self, real_images):
            if isinstance(real_images, tuple):
                real_images = real_images[0]
            # Sample random points in the latent space
            batch_size = keras.ops.shape(real_images)[0]
            random_latent_vectors = keras.random.normal(
                shape=(batch_size, self.latent_dim), seed=self.seed_generator
            )

            # Decode them to fake images
            generated_images = self.generator(random_latent_vectors)

            # Combine them with real images
            real_images = keras.ops.convert_to_tensor(real_images)
            combined_images = keras.ops.concatenate(
                [keras.ops.cast(generated_images, "float32"), real_images],
                axis=0,
            )

            # Assemble labels discriminating real from fake images
            labels = keras.ops.concatenate(
                [
                    keras.ops.ones((batch_size, 1)),
                    keras.ops.zeros((batch_size, 1)),
                ],
                axis=0,
            )
            # Add random noise to the labels - important trick!
            labels += 0.05 * keras.random.uniform(
                keras.ops.shape(labels), seed=self.seed_generator
            )

            # Train the discriminator
            d_loss = self._step(
                self.d_optimizer,
                lambda: self.loss_fn(
                    labels, self.discriminator(combined_images)
                ),
                self.discriminator.trainable_weights,
            )

            # Sample random points in the latent space
            random_latent_vectors = keras.random.normal(
                shape=(batch_size, self.latent_dim), seed=self.seed_generator
            )

            # Assemble labels that say "all real images"
            misleading_labels = keras.ops.zeros((batch_size, 1))

            # Train the generator (note that we should *not* update the
            # weights of the discriminator)!
            g_loss = self._step(
                self.g_optimizer,
                lambda: self.loss_fn(
                    misleading_labels,
                    self.discriminator(self.generator(random_latent_vectors)),
                ),
                self.generator.trainable_weights,
            )

            # Update metrics and return their value.
            self.d_loss_tracker.update_state(d_loss)
            self.g_loss_tracker.update_state(g_loss)
            return {
                "d_loss": self.d_loss_tracker.result(),
                "g_loss": self.g_loss_tracker.result(),
            }

    return GAN


def gan(scale=False, features=8, latent_dim=4, seed=0):
    """The guide's GAN (small dense networks), uncompiled."""
    keras.utils.set_random_seed(seed)
    discriminator = keras.Sequential(
        [
            keras.Input(shape=(features,)),
            keras.layers.Dense(16),
            keras.layers.LeakyReLU(negative_slope=0.2),
            keras.layers.Dense(1, dtype="float32"),
        ],
        name="discriminator",
    )
    generator = keras.Sequential(
        [
            keras.Input(shape=(latent_dim,)),
            keras.layers.Dense(16),
            keras.layers.LeakyReLU(negative_slope=0.2),
            keras.layers.Dense(features),
        ],
        name="generator",
    )
    return _gan_class(scale)(discriminator, generator, latent_dim)


def images(n=64, features=8, seed=0):
    """The GAN's "real images": float32 rows."""
    return (
        np.random.default_rng(seed).normal(size=(n, features)).astype("float32")
    )
