"""The training loops keras-io's guides "Writing a training loop from
scratch" write (in TensorFlow, in JAX, in PyTorch), written as the guides
write them, so that kmp is tested on loops it did not write.

Each loop is the guide's first end-to-end example: `get_model()`, the
guide's loss, a batch loop that takes the gradients itself and calls
`optimizer.apply` (TensorFlow, eagerly or in the guide's `@tf.function
train_step`; PyTorch after `loss.backward()`) or `optimizer.stateless_apply`
(JAX, in the guide's `@jax.jit train_step`). What differs from the guides,
and why:

- the data: synthetic MNIST of the guides' shapes and dtypes (the
  machine cannot download MNIST), `STEPS` batches of 32, in order (no
  shuffle: the float32 and the mixed run see the same batches); the JAX
  guide feeds `tf.data` batches through `.numpy()`, here NumPy batches
  straight away; the torch guide's `DataLoader` is kept;
- `scale=True` adds the one line kmp's message asks for (`loss_value =
  optimizer.scale_loss(loss_value)` inside the tape or before
  `backward()`; on JAX `optimizer.stateless_scale_loss(
  optimizer_variables, loss)` in `compute_loss_and_updates`, which
  therefore takes the optimizer's variables as one more argument, unused
  when `scale=False`); the line is `_scaling`'s, as in `keras_io_steps`;
- the JAX guide's first `state` holds the Keras variables themselves,
  which JAX 0.10 refuses in a jitted call ("Triggering __jax_array__()
  during abstractification is no longer supported"): here their values;
- each loop returns the trained weights as NumPy arrays (the JAX one
  assigns its state back to the model, as the guide does after its loop).

The caller picks the optimizer (the guides' Adam, or SGD, which shows
every factor of a wrong scale) and the policy.
"""

import keras
import numpy as np

from kmp import backend

STEPS, BATCH = 8, 32


def get_model():
    """The guides' MNIST model."""
    inputs = keras.Input(shape=(784,), name="digits")
    x1 = keras.layers.Dense(64, activation="relu")(inputs)
    x2 = keras.layers.Dense(64, activation="relu")(x1)
    outputs = keras.layers.Dense(10, name="predictions")(x2)
    model = keras.Model(inputs=inputs, outputs=outputs)
    return model


def mnist_like(n=STEPS * BATCH, seed=0):
    """Synthetic MNIST as the guides read it: 784 pixels in [0, 255] (the
    TensorFlow guide keeps uint8, the others cast to float32) and labels
    (integers for TensorFlow's sparse loss, one-hot for the others')."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 784)).astype("uint8")
    y = rng.integers(0, 10, size=(n,)).astype("uint8")
    if backend.name() == "tensorflow":
        return x, y
    return x.astype("float32"), keras.utils.to_categorical(y)


def _scaling(optimizer, scale, optimizer_variables=None):
    """The line kmp's message asks for, or nothing (`keras_io_steps`)."""
    if not scale:
        return lambda loss: loss
    if optimizer_variables is not None and hasattr(
        optimizer, "stateless_scale_loss"
    ):
        return lambda loss: optimizer.stateless_scale_loss(
            optimizer_variables, loss
        )
    return optimizer.scale_loss  # Keras's own scaler: the variable's scale


def tensorflow_loop(model, optimizer, scale=False):
    """The TensorFlow guide's eager loop."""
    import tensorflow as tf

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    train_dataset = tf.data.Dataset.from_tensor_slices(mnist_like())
    train_dataset = train_dataset.batch(BATCH)

    for step, (x_batch_train, y_batch_train) in enumerate(train_dataset):
        with tf.GradientTape() as tape:
            logits = model(x_batch_train, training=True)
            loss_value = loss_fn(y_batch_train, logits)
            loss_value = _scaling(optimizer, scale)(loss_value)
        grads = tape.gradient(loss_value, model.trainable_weights)
        optimizer.apply(grads, model.trainable_weights)

        # Log every 100 batches.
        if step % 100 == 0:
            print(
                f"Training loss (for 1 batch) at step {step}: "
                f"{float(loss_value):.4f}"
            )
    return [v.numpy() for v in model.trainable_weights]


def tensorflow_function_loop(model, optimizer, scale=False):
    """The TensorFlow guide's loop over its `@tf.function train_step`."""
    import tensorflow as tf

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    train_dataset = tf.data.Dataset.from_tensor_slices(mnist_like())
    train_dataset = train_dataset.batch(BATCH)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss_value = loss_fn(y, logits)
            loss_value = _scaling(optimizer, scale)(loss_value)
        grads = tape.gradient(loss_value, model.trainable_weights)
        optimizer.apply(grads, model.trainable_weights)
        return loss_value

    for step, (x_batch_train, y_batch_train) in enumerate(train_dataset):
        loss_value = train_step(x_batch_train, y_batch_train)

        # Log every 100 batches.
        if step % 100 == 0:
            print(
                f"Training loss (for 1 batch) at step {step}: "
                f"{float(loss_value):.4f}"
            )
    return [v.numpy() for v in model.trainable_weights]


def jax_loop(model, optimizer, scale=False):
    """The JAX guide's loop over its `@jax.jit train_step`."""
    import jax

    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)
    x_train, y_train = mnist_like()
    train_dataset = [
        (x_train[i : i + BATCH], y_train[i : i + BATCH])
        for i in range(0, len(x_train), BATCH)
    ]

    def compute_loss_and_updates(
        trainable_variables, non_trainable_variables, optimizer_variables, x, y
    ):
        y_pred, non_trainable_variables = model.stateless_call(
            trainable_variables, non_trainable_variables, x
        )
        loss = loss_fn(y, y_pred)
        loss = _scaling(optimizer, scale, optimizer_variables)(loss)
        return loss, non_trainable_variables

    grad_fn = jax.value_and_grad(compute_loss_and_updates, has_aux=True)

    @jax.jit
    def train_step(state, data):
        trainable_variables, non_trainable_variables, optimizer_variables = (
            state
        )
        x, y = data
        (loss, non_trainable_variables), grads = grad_fn(
            trainable_variables,
            non_trainable_variables,
            optimizer_variables,
            x,
            y,
        )
        trainable_variables, optimizer_variables = optimizer.stateless_apply(
            optimizer_variables, grads, trainable_variables
        )
        # Return updated state
        return loss, (
            trainable_variables,
            non_trainable_variables,
            optimizer_variables,
        )

    # Build optimizer variables.
    optimizer.build(model.trainable_variables)

    # The guide passes the variables themselves; JAX 0.10 refuses them
    # ("Triggering __jax_array__() during abstractification is no longer
    # supported"): their values.
    trainable_variables = [v.value for v in model.trainable_variables]
    non_trainable_variables = [v.value for v in model.non_trainable_variables]
    optimizer_variables = [v.value for v in optimizer.variables]
    state = trainable_variables, non_trainable_variables, optimizer_variables

    # Training loop
    for step, data in enumerate(train_dataset):
        loss, state = train_step(state, data)
        # Log every 100 batches.
        if step % 100 == 0:
            print(
                f"Training loss (for 1 batch) at step {step}: {float(loss):.4f}"
            )

    trainable_variables, non_trainable_variables, optimizer_variables = state
    for variable, value in zip(model.trainable_variables, trainable_variables):
        variable.assign(value)
    for variable, value in zip(
        model.non_trainable_variables, non_trainable_variables
    ):
        variable.assign(value)
    return [np.asarray(v.value) for v in model.trainable_weights]


def torch_loop(model, optimizer, scale=False):
    """The PyTorch guide's loop with a Keras optimizer and loss."""
    import torch

    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)
    x_train, y_train = mnist_like()
    train_dataset = torch.utils.data.TensorDataset(
        torch.from_numpy(x_train), torch.from_numpy(y_train)
    )
    train_dataloader = torch.utils.data.DataLoader(
        train_dataset, batch_size=BATCH, shuffle=False
    )

    for step, (inputs, targets) in enumerate(train_dataloader):
        # Forward pass
        logits = model(inputs)
        loss = loss_fn(targets, logits)
        loss = _scaling(optimizer, scale)(loss)

        # Backward pass
        model.zero_grad()
        trainable_weights = [v for v in model.trainable_weights]

        # Call torch.Tensor.backward() on the loss to compute gradients
        # for the weights.
        loss.backward()
        gradients = [v.value.grad for v in trainable_weights]

        # Update weights
        with torch.no_grad():
            optimizer.apply(gradients, trainable_weights)

        # Log every 100 batches.
        if step % 100 == 0:
            print(
                f"Training loss (for 1 batch) at step {step}: "
                f"{loss.detach().numpy():.4f}"
            )
    return [v.value.detach().cpu().numpy() for v in model.trainable_weights]


def loops():
    """The running backend's loops, by name."""
    return {
        "tensorflow": {
            "eager": tensorflow_loop,
            "tf.function": tensorflow_function_loop,
        },
        "jax": {"jax.jit": jax_loop},
        "torch": {"eager": torch_loop},
    }[backend.name()]


def gan_networks(latent_dim=128, width=128):
    """The TensorFlow guide's discriminator and generator, as it builds
    them (its end-to-end example: "a GAN training loop from scratch"),
    with `width` channels where the guide has 128 (and half where it has
    64): float16 convolutions on a CPU are slow (4 steps of the guide's
    size took 61 s on 2 cores, float32's 1.3 s)."""
    discriminator = keras.Sequential(
        [
            keras.Input(shape=(28, 28, 1)),
            keras.layers.Conv2D(
                width // 2, (3, 3), strides=(2, 2), padding="same"
            ),
            keras.layers.LeakyReLU(negative_slope=0.2),
            keras.layers.Conv2D(width, (3, 3), strides=(2, 2), padding="same"),
            keras.layers.LeakyReLU(negative_slope=0.2),
            keras.layers.GlobalMaxPooling2D(),
            keras.layers.Dense(1),
        ],
        name="discriminator",
    )
    generator = keras.Sequential(
        [
            keras.Input(shape=(latent_dim,)),
            # We want to generate 128 coefficients to reshape into a
            # 7x7x128 map
            keras.layers.Dense(7 * 7 * width),
            keras.layers.LeakyReLU(negative_slope=0.2),
            keras.layers.Reshape((7, 7, width)),
            keras.layers.Conv2DTranspose(
                width, (4, 4), strides=(2, 2), padding="same"
            ),
            keras.layers.LeakyReLU(negative_slope=0.2),
            keras.layers.Conv2DTranspose(
                width, (4, 4), strides=(2, 2), padding="same"
            ),
            keras.layers.LeakyReLU(negative_slope=0.2),
            keras.layers.Conv2D(
                1, (7, 7), padding="same", activation="sigmoid"
            ),
        ],
        name="generator",
    )
    return discriminator, generator


def tensorflow_gan_loop(
    discriminator, generator, d_optimizer, g_optimizer, steps=4, batch_size=8
):
    """The TensorFlow guide's GAN loop over its `@tf.function train_step`
    (two optimizers), on `steps` batches of synthetic digits in [0, 1].
    """
    import tensorflow as tf

    latent_dim = 128
    # Instantiate a loss function.
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function
    def train_step(real_images):
        # Sample random points in the latent space
        random_latent_vectors = tf.random.normal(shape=(batch_size, latent_dim))
        # Decode them to fake images
        generated_images = generator(random_latent_vectors)
        # Combine them with real images
        combined_images = tf.concat([generated_images, real_images], axis=0)

        # Assemble labels discriminating real from fake images
        labels = tf.concat(
            [tf.ones((batch_size, 1)), tf.zeros((real_images.shape[0], 1))],
            axis=0,
        )
        # Add random noise to the labels - important trick!
        labels += 0.05 * tf.random.uniform(labels.shape)

        # Train the discriminator
        with tf.GradientTape() as tape:
            predictions = discriminator(combined_images)
            d_loss = loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, discriminator.trainable_weights)
        d_optimizer.apply(grads, discriminator.trainable_weights)

        # Sample random points in the latent space
        random_latent_vectors = tf.random.normal(shape=(batch_size, latent_dim))
        # Assemble labels that say "all real images"
        misleading_labels = tf.zeros((batch_size, 1))

        # Train the generator (note that we should *not* update the weights
        # of the discriminator)!
        with tf.GradientTape() as tape:
            predictions = discriminator(generator(random_latent_vectors))
            g_loss = loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, generator.trainable_weights)
        g_optimizer.apply(grads, generator.trainable_weights)
        return d_loss, g_loss, generated_images

    digits = np.random.default_rng(0).random((steps * batch_size, 28, 28, 1))
    dataset = tf.data.Dataset.from_tensor_slices(digits.astype("float32"))
    dataset = dataset.batch(batch_size)
    for step, real_images in enumerate(dataset):
        # Train the discriminator & generator on one batch of real images.
        d_loss, g_loss, generated_images = train_step(real_images)

        # Logging.
        if step % 100 == 0:
            # Print metrics
            print(f"discriminator loss at step {step}: {d_loss:.2f}")
            print(f"adversarial loss at step {step}: {g_loss:.2f}")
