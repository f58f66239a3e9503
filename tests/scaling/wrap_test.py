"""`kmp.wrap` and `upgrade_stock_scaler` (`kmp.scaling.wrap`): which scaler a
model gets, and Keras's own made kmp's in place."""

import keras
import numpy as np
import pytest
from util import mlp

import kmp
from kmp.scaling import upgrade_stock_scaler


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "policy, expected",
    [
        ("mixed_float16", kmp.LossScaleOptimizer),
        ("mixed_bfloat16", keras.optimizers.Adam),
        ("float32", keras.optimizers.Adam),
    ],
)
def test_wrap_scales_only_under_float16(policy, expected):
    kmp.enable(policy)
    # An optimizer is of its class once built (until then its rounding
    # of bfloat16 weights waits for them: `kmp.memory.modes`).
    weights = [keras.Variable(np.ones((2,), "float32"))]
    named = kmp.wrap("adam")
    named.build(weights)
    assert type(named) is expected
    adam = keras.optimizers.Adam()
    wrapped = kmp.wrap(adam, initial_scale=128)
    assert isinstance(wrapped, expected)
    wrapped.build(weights)
    assert type(wrapped) is expected
    if expected is kmp.LossScaleOptimizer:
        assert wrapped.inner_optimizer is adam
        assert wrapped.initial_scale == 128
        assert kmp.wrap(wrapped) is wrapped
    else:
        assert wrapped is adam


@pytest.mark.backend_independent
def test_wrap_replaces_an_unbuilt_stock_scaler():
    kmp.enable("mixed_float16")
    adam = keras.optimizers.Adam()
    stock = keras.optimizers.LossScaleOptimizer(
        adam, initial_scale=64, dynamic_growth_steps=10
    )
    wrapped = kmp.wrap(stock)
    assert type(wrapped) is kmp.LossScaleOptimizer
    assert wrapped.inner_optimizer is adam
    assert (wrapped.initial_scale, wrapped.dynamic_growth_steps) == (64, 10)


@pytest.mark.backend_independent
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_wrap_rejects_bad_input_in_every_mode(policy):
    kmp.enable(policy)
    with pytest.raises(ValueError, match="must be a keras.optimizers"):
        kmp.wrap(42)
    with pytest.raises(ValueError, match="Could not interpret optimizer"):
        kmp.wrap("no_such_optimizer")
    with pytest.raises(ValueError, match="`growth_factor` must be > 1"):
        kmp.wrap("adam", growth_factor=0.5)
    with pytest.raises(ValueError, match="unexpected arguments"):
        kmp.wrap("adam", growth=2.0)


@pytest.mark.backend_independent
def test_compile_keeps_kmp_scaler():
    kmp.enable("mixed_float16")
    model = mlp()
    model.compile(optimizer=kmp.wrap("adam"), loss="mse")
    assert type(model.optimizer) is kmp.LossScaleOptimizer


def _stock(**kwargs):
    return keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(1.0, momentum=0.5), **kwargs
    )


def test_an_unbuilt_stock_scaler_becomes_kmp_s_with_its_arguments():
    stock = _stock(initial_scale=64, dynamic_growth_steps=10)
    inner = stock.inner_optimizer
    assert upgrade_stock_scaler(stock) is stock
    assert type(stock) is kmp.LossScaleOptimizer
    assert stock.inner_optimizer is inner
    assert (stock.initial_scale, stock.dynamic_growth_steps) == (64, 10)
    assert (stock.min_scale, stock.max_scale) == (1.0, 2.0**24)
    stock.build([keras.Variable([1.0, 1.0])])
    fresh = kmp.LossScaleOptimizer(keras.optimizers.SGD(1.0, momentum=0.5))
    fresh.build([keras.Variable([1.0, 1.0])])
    # Checkpoints load optimizer variables by position: the same order.
    names = [x.name for x in stock.variables]
    assert len(names) == len(fresh.variables)
    assert (
        names[:6]
        == [x.name for x in fresh.variables][:6]
        == [
            "iteration",
            "learning_rate",
            "step_counter",
            "dynamic_scale",
            "skipped_steps",
            "overflow_streak",
        ]
    )
    config = keras.saving.serialize_keras_object(stock)
    assert config["registered_name"] == "kmp>LossScaleOptimizer"


def test_a_built_stock_scaler_keeps_its_state_and_slots():
    stock = _stock(initial_scale=2.0**30, dynamic_growth_steps=3)
    v = keras.Variable([1.0, 2.0])
    stock.build([v])
    stock.step_counter.assign(2)
    stock.inner_optimizer.momentums[0].assign([0.25, 0.5])
    before = [id(x) for x in stock.variables]
    upgrade_stock_scaler(stock)
    after = [id(x) for x in stock.variables]
    # The same variable objects, in order, and kmp's two counters.
    assert [i for i in after if i in before] == before
    assert len(after) == len(before) + 2
    assert float(stock.loss_scale) == 2.0**30  # bounds widened to hold it
    assert stock.max_scale == 2.0**30
    assert int(stock.step_counter) == 2
    assert int(stock.skipped_steps) == int(stock.overflow_streak) == 0
    np.testing.assert_array_equal(
        stock.inner_optimizer.momentums[0].numpy(), [0.25, 0.5]
    )


def test_a_stock_scale_that_fell_to_zero_is_lifted_to_the_floor():
    stock = _stock()
    stock.build([keras.Variable([1.0])])
    stock.dynamic_scale.assign(0.0)  # the stock defect's end state
    upgrade_stock_scaler(stock)
    assert float(stock.loss_scale) == 1.0


@pytest.mark.backend_independent
@pytest.mark.parametrize("optimizer", ["kmp", "subclass", "plain"])
def test_only_keras_s_own_class_is_upgraded(optimizer):
    class Custom(keras.optimizers.LossScaleOptimizer):
        pass

    inner = keras.optimizers.SGD()
    given = {
        "kmp": kmp.LossScaleOptimizer(inner),
        "subclass": Custom(inner),
        "plain": inner,
    }[optimizer]
    with pytest.raises(TypeError, match="takes a keras.optimizers.LossScale"):
        upgrade_stock_scaler(given)
