"""Keras's float8 gradient state under kmp's scaler
(`kmp.scaling.keras_float8`): found among the trainable variables, reset
to the loss scale when the optimizer builds, multiplied with each change
of the scale. The end-to-end check (the same weights at any loss scale):
tests/fp8/convert_test.py."""

import warnings

import keras
import numpy as np
from keras import ops

import kmp
from kmp.scaling import keras_float8


def _float8_model():
    with kmp.policy_scope("mixed_bfloat16"):
        inputs = keras.Input((16,))
        outputs = keras.layers.Dense(16, name="f8")(inputs)
        model = keras.Model(inputs, outputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "InputLayer has no quantize"
        model.quantize("float8")
    return model


def test_the_state_is_each_layer_s_output_gradient_scale_and_history():
    model = _float8_model()
    variables = model.trainable_variables
    positions = keras_float8.gradient_state(variables)
    assert sorted(variables[i].name for i in positions) == sorted(
        keras_float8.NAMES
    )
    plain = keras.layers.Dense(2)
    plain.build((None, 2))
    assert keras_float8.gradient_state(plain.trainable_variables) == []


def test_building_kmp_s_scaler_starts_the_state_at_its_scale():
    model = _float8_model()
    layer = model.get_layer("f8")
    layer.outputs_grad_amax_history.assign(
        ops.ones(layer.outputs_grad_amax_history.shape)
    )
    optimizer = kmp.LossScaleOptimizer(
        keras.optimizers.SGD(), initial_scale=256.0
    )
    optimizer.build(model.trainable_variables)
    assert float(layer.outputs_grad_scale) == 256.0  # Keras starts at 1
    assert not np.any(ops.convert_to_numpy(layer.outputs_grad_amax_history))
    # The forward's scales are not the loss scale's business.
    assert float(layer.inputs_scale) == 1.0


def test_a_change_of_the_scale_multiplies_the_state():
    model = _float8_model()
    layer = model.get_layer("f8")
    optimizer = kmp.LossScaleOptimizer(
        keras.optimizers.SGD(), initial_scale=8.0, dynamic_growth_steps=1
    )
    optimizer.build(model.trainable_variables)
    layer.outputs_grad_amax_history.assign(
        ops.full(layer.outputs_grad_amax_history.shape, 3.0)
    )
    grads = [ops.zeros(v.shape, v.dtype) for v in model.trainable_variables]
    # Keras's float8 "gradients" of its statistics are their new values.
    for i in keras_float8.gradient_state(model.trainable_variables):
        grads[i] = model.trainable_variables[i].value
    optimizer.scale_loss(1.0)  # the gradients are of the scaled loss
    optimizer.apply(grads, model.trainable_variables)  # finite: 8 -> 16
    assert float(optimizer.loss_scale) == 16.0
    assert float(layer.outputs_grad_scale) == 16.0
    history = ops.convert_to_numpy(layer.outputs_grad_amax_history)
    np.testing.assert_array_equal(history, np.full(history.shape, 6.0))
    grads[0] = ops.full(grads[0].shape, np.inf)
    optimizer.scale_loss(1.0)
    optimizer.apply(grads, model.trainable_variables)  # skip: 16 -> 8
    assert float(optimizer.loss_scale) == 8.0
    assert float(layer.outputs_grad_scale) == 8.0


def test_a_saved_run_resumes_as_if_it_had_not_stopped(tmp_path):
    # Keras restores a loaded model's variables and the optimizer's after
    # it builds the optimizer, so the reset at build does not touch the
    # saved state, which is in the units of the saved scale.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 16)).astype("float32")
    y = x[:, :4].argmax(1)

    def compiled():
        keras.utils.set_random_seed(0)
        model = _float8_model()
        model.compile(
            optimizer=kmp.LossScaleOptimizer(
                keras.optimizers.SGD(0.1),
                initial_scale=2.0**15,
                dynamic_growth_steps=3,
            ),
            loss="sparse_categorical_crossentropy",
        )
        return model

    def train(model):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)

    straight = compiled()
    train(straight)
    train(straight)
    stopped = compiled()
    train(stopped)
    path = str(tmp_path / "float8.keras")
    stopped.save(path)
    resumed = keras.saving.load_model(path)
    assert float(resumed.optimizer.loss_scale) == 2.0**15 * 2**2  # 8 steps
    train(resumed)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(resumed.get_layer("f8").kernel),
        ops.convert_to_numpy(straight.get_layer("f8").kernel),
    )


def _tiny_gradient_steps(optimizer, steps=6):
    """Steps applied of a float16 float8 EinsumDense whose output
    gradients are about 1e-5 (an attention's query projection at the
    start of training), at loss scale 1."""
    with kmp.policy_scope("mixed_float16"):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((8, 16))
        # ReLU: the gradient is 0 where the output is negative.
        x = keras.layers.EinsumDense("abc,cd->abd", (8, 16), activation="relu")(
            inputs
        )
        x = keras.layers.Rescaling(1e-3, dtype="float32")(x)
        # Keras's float8 path: its gradient scales are what is floored.
        model = kmp.float8(keras.Model(inputs, x), also=[".*"], matmul="keras")
    model.compile(optimizer=optimizer, loss="mae")  # d/dy: 1e-3 / 128
    x = np.random.default_rng(0).standard_normal((steps, 8, 16))
    model.fit(x, np.zeros((steps, 8, 16)), batch_size=1, verbose=0)
    return int(model.optimizer.iterations)


def test_float16_gradient_scales_below_float16_s_range_are_floored():
    # Defect 26: Keras computes the next scale as amax / 57344 (1.4e-10
    # here) and divides the float16 gradient by it cast to float16: 0.
    # Where the gradient is 0 (the ReLU's), 0 / 0 is NaN. The first two
    # steps still use the initial scale 1 (a delayed scale comes from the
    # steps before); Keras's scaler then skips every step, halving the
    # loss scale each time, while the float8 scale stays.
    # kmp's scaler floors the scale at loss_scale * 2**-14.
    stock = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=1.0
    )
    assert _tiny_gradient_steps(stock) == 2
    fixed = kmp.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=1.0, dynamic=False
    )
    assert _tiny_gradient_steps(fixed) == 6


def test_the_floor_is_in_units_of_the_loss_scale():
    value = ops.convert_to_tensor([1e-9, 1.0], "float32")
    floored = keras_float8.floored(value, 2.0**10)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(floored), [2.0**10 * 2.0**-14, 1.0]
    )
