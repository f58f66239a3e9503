"""The memory modes on training code kmp did not write: the train step of
keras-io's "Customizing what happens in `fit()`" guide on each backend,
and its GAN with two optimizers (TensorFlow and PyTorch guides), under
`kmp.enable("mixed_bfloat16", master_weights="bfloat16")` with
`kmp.wrap` optimizers: bfloat16 weights and slots, rounded
stochastically, learning as float32 masters do; the guide's model
through a `.keras` file and back, resuming."""

import keras
import keras_io_steps
import numpy as np
import pytest
from keras import ops

import kmp
from kmp import backend
from kmp.memory import optimizer_state

STEPS, BATCH = 8, 8


def _data(features=8):
    x = np.random.default_rng(1).normal(size=(STEPS * BATCH, features))
    x = x.astype("float32")
    return x, x.mean(axis=1, keepdims=True)


def _flat(variables):
    return np.concatenate(
        [
            ops.convert_to_numpy(ops.cast(v, "float32"))
            .astype("float64")
            .ravel()
            for v in variables
        ]
    )


def _weights_and_slots(model, optimizer, weights=None):
    """`{shape: dtypes}` of the weights (the guide's output layers are
    float32, as it declares them; the rest bfloat16) and, apart, of the
    optimizer's slots: each slot is stored as its weight."""
    weights = weights or model.trainable_weights
    shapes = {tuple(w.shape) for w in weights}

    def dtypes(variables):
        found = {}
        for v in variables:
            if tuple(v.shape) in shapes and "float" in str(v.dtype):
                found.setdefault(tuple(v.shape), set()).add(str(v.dtype))
        return found

    return dtypes(weights), dtypes(
        v for v in optimizer.variables if len(v.shape)
    )


def _same_start(model, maker):
    """`model` given the weights `maker()` makes under float32 masters
    (the initializers draw other numbers in bfloat16), rounded to its
    dtypes: the two runs start from one point."""
    with kmp.policy_scope("mixed_bfloat16"):
        start = maker()
    for variable, value in zip(model.weights, start.weights):
        variable.assign(ops.cast(value, variable.dtype))


def _fit_custom(master_weights):
    """The guide's `CustomModel`, SGD with momentum, 8 steps; the model and
    its weights' update."""
    with kmp.policy_scope("mixed_bfloat16", master_weights):
        model = keras_io_steps.custom_model()
        _same_start(model, keras_io_steps.custom_model)
        before = _flat(model.trainable_weights)
        model.compile(
            optimizer=kmp.wrap(keras.optimizers.SGD(0.05, momentum=0.9)),
            loss="mse",
            metrics=["mae"],
        )
        x, y = _data()
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    return model, _flat(model.trainable_weights) - before


def _off(update, reference):
    return np.linalg.norm(update - reference) / np.linalg.norm(reference)


def test_a_keras_io_train_step_learns_in_bfloat16_weights_and_slots(tmp_path):
    _, float32 = _fit_custom("float32")
    model, ours = _fit_custom("bfloat16")
    weights, slots = _weights_and_slots(model, model.optimizer)
    assert weights == {
        (8, 16): {"bfloat16"},
        (16,): {"bfloat16"},
        (16, 1): {"float32"},  # the guide's `Dense(1, dtype="float32")`
        (1,): {"float32"},
    }
    assert slots == weights
    assert optimizer_state.rounding_of(model.optimizer) == "stochastic"
    # The same update as float32 masters, to bfloat16's compute and
    # storage (float32 masters compute in bfloat16 too).
    assert _off(ours, float32) < 0.05, _off(ours, float32)

    # Through a `.keras` file: the same weights, slots and mode; resumes.
    path = str(tmp_path / "custom.keras")
    model.save(path)
    with kmp.policy_scope("mixed_bfloat16", "bfloat16"):
        loaded = kmp.load_model(
            path,
            custom_objects={"CustomModel": keras_io_steps.custom_model_class()},
        )
    assert type(loaded.optimizer) is type(model.optimizer)
    assert optimizer_state.rounding_of(loaded.optimizer) == "stochastic"
    for saved, back in (
        (model.trainable_weights, loaded.trainable_weights),
        (model.optimizer.variables, loaded.optimizer.variables),
    ):
        assert [str(v.dtype) for v in back] == [str(v.dtype) for v in saved]
        np.testing.assert_array_equal(_flat(back), _flat(saved))
    x, y = _data()
    loaded.fit(x, y, batch_size=BATCH, epochs=1, steps_per_epoch=2, verbose=0)
    assert int(loaded.optimizer.iterations) == STEPS + 2


@pytest.mark.skipif(
    backend.name() == "jax", reason="keras-io's JAX guide has no GAN"
)
def test_a_keras_io_gan_s_two_optimizers_learn_in_bfloat16():
    def fit(master_weights):
        with kmp.policy_scope("mixed_bfloat16", master_weights):
            gan = keras_io_steps.gan()
            nets = (gan.discriminator, gan.generator)
            _same_start(gan, keras_io_steps.gan)
            before = [_flat(n.trainable_weights) for n in nets]
            gan.compile(
                d_optimizer=kmp.wrap(keras.optimizers.Adam(1e-3)),
                g_optimizer=kmp.wrap(keras.optimizers.Adam(1e-3)),
                loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
            )
            gan.fit(keras_io_steps.images(), batch_size=BATCH, verbose=0)
        moved = [_flat(n.trainable_weights) - b for n, b in zip(nets, before)]
        return gan, moved

    _, float32 = fit("float32")
    gan, ours = fit("bfloat16")
    pairs = (
        (gan.d_optimizer, gan.discriminator),
        (gan.g_optimizer, gan.generator),
    )
    for optimizer, net in pairs:
        assert optimizer_state.rounding_of(optimizer) == "stochastic"
        assert int(optimizer.iterations) == STEPS
        weights, slots = _weights_and_slots(net, optimizer)
        assert slots == weights
    # The generator all bfloat16; the discriminator but its float32 logit.
    assert {str(w.dtype) for w in gan.generator.trainable_weights} == {
        "bfloat16"
    }
    assert [str(w.dtype) for w in gan.discriminator.trainable_weights] == [
        "bfloat16",
        "bfloat16",
        "float32",
        "float32",
    ]
    # Each network moved as with float32 masters. Adam's steps are about
    # lr (1e-3) whatever the gradient: a weight near 0.3 moves some five
    # bfloat16 steps in the 8 updates, and each write's rounding adds up
    # to half a step of zero-mean noise; so the direction and the size
    # of the move, not each weight's.
    for update, reference in zip(ours, float32):
        cosine = update @ reference / np.linalg.norm(update)
        cosine /= np.linalg.norm(reference)
        size = np.linalg.norm(update) / np.linalg.norm(reference)
        assert cosine > 0.9 and 0.8 < size < 1.25, (cosine, size)
