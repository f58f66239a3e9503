"""kmp.islands.BatchNormalization: Keras's batch normalization, its
float32 arithmetic in one fused kernel on torch. The same outputs,
moving statistics and training as Keras's layer, in a fraction of the
aten calls; `kmp.pin_float32` puts it in on torch, and a `.keras` file
keeps it."""

import collections

import keras
import numpy as np
import pytest
from util import torch_calls

import kmp
from kmp import backend
from kmp.islands import BatchNormalization

torch_only = pytest.mark.skipif(
    backend.name() != "torch", reason="the fused kernel is torch's"
)


def convnet(seed=0, bn=keras.layers.BatchNormalization, **bn_args):
    """Conv -> BatchNorm -> ReLU, twice, and a float32 head."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    x = inputs
    for i, filters in enumerate((8, 16)):
        x = keras.layers.Conv2D(
            filters, 3, padding="same", use_bias=False, name=f"conv{i}"
        )(x)
        x = bn(momentum=0.8, name=f"bn{i}", **bn_args)(x)
        x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(4, dtype="float32", name="head")(x)
    return keras.Model(inputs, outputs)


def data(count=32, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((count, 8, 8, 3)) * 2 + 0.5).astype("float32")
    return x, rng.integers(0, 4, count)


def trained(bn, policy, steps=4):
    with kmp.policy_scope(policy):
        model = convnet(bn=bn)
        model.compile(
            optimizer=kmp.wrap(keras.optimizers.SGD(0.05)),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    x, y = data()
    for i in range(steps):
        model.train_on_batch(x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8])
    return model


def weights(model):
    return {
        v.path: keras.ops.convert_to_numpy(v).astype("float32")
        for v in model.weights
    }


@torch_only  # elsewhere it is Keras's own call
@pytest.mark.parametrize(
    "policy, atol", [("float32", 1e-5), ("mixed_bfloat16", 1e-4)]
)
def test_it_trains_as_keras_s_layer_does(policy, atol):
    # Keras's layer and this one from the same start, the same batches:
    # the same weights and moving statistics after four steps, to
    # float32's rounding (measured: 2.4e-7 in float32, 3.1e-6 under
    # mixed_bfloat16, where the two round their outputs to bfloat16 from
    # float32 values summed in other orders).
    keras_model = trained(keras.layers.BatchNormalization, policy)
    kmp_model = trained(BatchNormalization, policy)
    got, want = weights(kmp_model), weights(keras_model)
    assert sorted(got) == sorted(want)
    for path in want:
        np.testing.assert_allclose(
            got[path], want[path], atol=atol, err_msg=path
        )
    # The moving statistics moved (momentum 0.8, four steps).
    assert np.abs(got["bn0/moving_mean"]).max() > 0.01
    x, _ = data(seed=1)
    np.testing.assert_allclose(
        kmp_model.predict(x, verbose=0),
        keras_model.predict(x, verbose=0),
        atol=10 * atol,
    )


def aten_calls(model, x, y):
    """The aten calls of one training step, by name."""
    calls = torch_calls(lambda: model.train_on_batch(x, y))
    return collections.Counter(str(func) for func, _, _ in calls)


@torch_only
def test_a_training_step_runs_one_kernel_a_layer_each_way():
    x, y = data(8)
    keras_model = trained(keras.layers.BatchNormalization, "mixed_bfloat16", 1)
    kmp_model = trained(BatchNormalization, "mixed_bfloat16", 1)
    ours, theirs = aten_calls(kmp_model, x, y), aten_calls(keras_model, x, y)
    assert ours["aten.native_batch_norm.default"] == 2
    assert ours["aten.native_batch_norm_backward.default"] == 2
    assert theirs["aten.native_batch_norm.default"] == 0
    # What the fused kernel saves: Keras's moments, normalization and
    # casts, forward and backward, some sixty calls a layer here.
    saved = sum(theirs.values()) - sum(ours.values())
    assert saved > 2 * 40, (sum(theirs.values()), sum(ours.values()))


@torch_only
def test_pin_float32_puts_it_in_on_torch_only_for_keras_s_own_class():
    class Mine(keras.layers.BatchNormalization):
        pass

    with kmp.policy_scope("mixed_float16"):
        model = convnet()
        mine = Mine(name="mine")
        model = keras.Sequential([model, keras.layers.Reshape((4, 1)), mine])
        model.build((None, 8, 8, 3))
    kmp.pin_float32(model)
    inner = model.layers[0]
    assert type(inner.get_layer("bn0")) is BatchNormalization
    assert type(inner.get_layer("bn1")) is BatchNormalization
    assert type(mine) is Mine  # a subclass keeps its own code


@pytest.mark.skipif(backend.name() == "torch", reason="torch swaps it")
def test_pin_float32_leaves_keras_s_layer_where_xla_fuses_it():
    with kmp.policy_scope("mixed_float16"):
        model = kmp.pin_float32(convnet())
    assert type(model.get_layer("bn0")) is keras.layers.BatchNormalization


@torch_only  # elsewhere it is Keras's own call
@pytest.mark.parametrize(
    "bn_args", [{"renorm": True}, {"center": False, "scale": False}]
)
def test_renorm_and_no_affine_train_as_keras_s(bn_args):
    # Batch renormalization takes Keras's own call; no gamma or beta, the
    # fused kernel without them.
    with kmp.policy_scope("float32"):
        keras_model = convnet(**bn_args)
        kmp_model = convnet(bn=BatchNormalization, **bn_args)
    x, _ = data()
    for model in (keras_model, kmp_model):
        model(x, training=True)
    got, want = weights(kmp_model), weights(keras_model)
    for path in want:
        np.testing.assert_allclose(
            got[path], want[path], atol=1e-5, err_msg=path
        )


def test_a_keras_file_keeps_it(tmp_path):
    model = trained(BatchNormalization, "mixed_bfloat16", 2)
    model.save(tmp_path / "model.keras")
    loaded = kmp.load_model(tmp_path / "model.keras")
    assert type(loaded.get_layer("bn0")) is BatchNormalization
    x, _ = data(seed=2)
    np.testing.assert_array_equal(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0)
    )
