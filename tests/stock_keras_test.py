"""Stock Keras's side of README's defect table ("Why not Keras's own
`mixed_float16`?"), for the rows whose other tests run kmp's side only.

Each test shows the defect on the Keras releases its `describes` names:
3.15 (3.15.1, the version the suite pins) and 3.16 (keras-nightly
3.16.0.dev2026102704, `.ci/nightly`); where the two differ, the test
asserts each one's behaviour, and on any other release it is skipped,
its reason naming the release. The test named beside it in README's
table shows kmp's fix. The rows that need two worker processes (the
NumPy shuffle, the hang of Keras's scaler, the backup and a missing
worker) are shown by the reproductions in BUILD_NOTES.md instead.
"""

import collections
import logging
import warnings

import keras
import numpy as np
import pytest
from keras import ops
from util import CentralizedSGD
from util import DropoutBlock
from util import DtypeRecordingDense
from util import classification_data
from util import mlp
from util import probability_model
from util import saved_under_keras_s_scaler
from util import tf_only
from util import torch_calls
from util import torch_only

import kmp
from kmp import backend


def describes(*releases):
    """Runs the test on stock Keras of those releases ("3.15"); on
    another, skips it with a reason that names the running version."""
    running = "{}.{}".format(*backend.keras_version())
    return pytest.mark.skipif(
        running not in releases,
        reason=f"describes stock Keras {' and '.join(releases)}, not "
        f"Keras {keras.__version__}",
    )


def _stock(**kwargs):
    return keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), **kwargs
    )


@describes("3.15", "3.16")
@pytest.mark.backend_independent
@pytest.mark.parametrize("argument", ["growth_factor", "backoff_factor"])
def test_stock_scaler_takes_no_growth_or_backoff_factor(argument):
    # Growth x2 and backoff x0.5 are literals in the stock class.
    with pytest.raises(ValueError, match=f"does not support.*{argument}"):
        _stock(**{argument: 4.0})


@describes("3.15", "3.16")
@pytest.mark.backend_independent
def test_stock_scaler_has_no_hysteresis():
    with pytest.raises(ValueError, match="does not support.*hysteresis"):
        _stock(hysteresis=2)


@describes("3.15", "3.16")
@pytest.mark.backend_independent
def test_stock_scaler_refuses_dynamic_false():
    with pytest.raises(ValueError, match="no longer supports `dynamic=False`"):
        _stock(dynamic=False)


@describes("3.15", "3.16")
@pytest.mark.backend_independent
def test_stock_scaler_has_no_tf_keras_loss_scaling_methods():
    stock = _stock()
    assert not hasattr(stock, "get_scaled_loss")
    assert not hasattr(stock, "get_unscaled_gradients")


@describes("3.15", "3.16")
def test_stock_scaler_logs_neither_its_scale_nor_skipped_steps():
    keras.config.set_dtype_policy("mixed_float16")
    model = mlp()
    stock = _stock()
    model.compile(optimizer=stock, loss="sparse_categorical_crossentropy")
    x, y = classification_data(n=64)
    x[0, 0] = 1e9  # inf once cast to float16: the first step overflows
    history = model.fit(x, y, batch_size=32, shuffle=False, verbose=0)
    assert float(stock.dynamic_scale) == 2.0**14  # a step was skipped,
    assert set(history.history) == {"loss"}  # no log says so,
    assert not hasattr(stock, "skipped_steps")  # and nothing counts it


@describes("3.15", "3.16")
def test_float16_output_softmax_gives_crossentropy_of_rounded_probabilities():
    # Logits [0, -30], true class 1: the crossentropy is 30. A float16
    # softmax output rounds e**-30 to 0, and Keras's loss clips it to
    # 1e-7: 16.118, with no gradient.
    loss = keras.losses.SparseCategoricalCrossentropy()
    x, y = np.ones((1, 1), "float32"), np.array([1])

    def crossentropy(model):
        return float(ops.convert_to_numpy(loss(y, model(x))))

    mixed = probability_model("mixed_float16")
    assert crossentropy(mixed) == pytest.approx(16.118, abs=1e-3)
    if keras.backend.backend() == "tensorflow":
        # The float32 model keeps TensorFlow's logits path.
        float32 = probability_model("float32")
        assert crossentropy(float32) == pytest.approx(30.0)


def unlikely_class_model(policy):
    """A float16 softmax output (under `policy`) whose true class, 1, has
    logits [0, -9]: a probability of 1.2e-4, which the step is to raise."""
    with kmp.policy_scope(policy):
        model = keras.Sequential(
            [keras.Input((1,)), keras.layers.Dense(2, activation="softmax")]
        )
    model.layers[0].set_weights([np.zeros((1, 2)), np.array([0.0, -9.0])])
    return model


@describes("3.15", "3.16")
def test_float16_output_softmax_stalls_crossentropy_under_loss_scaling():
    # Crossentropy's gradient reaches the softmax as scale / (batch * p):
    # 32768 / (8 * 1.2e-4), past float16's 65504, so every step is
    # skipped until the scale falls under 64. On every backend (the
    # logits path, defect 8, is TensorFlow's only).
    x, y = np.ones((8, 1), "float32"), np.ones((8,), "int32")

    def losses(model, optimizer):
        model.compile(
            optimizer=optimizer, loss="sparse_categorical_crossentropy"
        )
        history = model.fit(x, y, batch_size=8, epochs=5, verbose=0)
        return history.history["loss"]

    stock = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    stalled = losses(unlikely_class_model("mixed_float16"), stock)
    assert stalled == [pytest.approx(stalled[0], abs=1e-3)] * 5  # all skipped
    trained = losses(unlikely_class_model("float32"), keras.optimizers.SGD(0.1))
    assert trained[0] == pytest.approx(stalled[0], abs=1e-2)
    assert trained[-1] < trained[0] - 1.0


@describes("3.15", "3.16")
@pytest.mark.backend_independent
def test_set_dtype_policy_says_nothing_about_the_hardware(caplog, capsys):
    # kmp.enable warns where a mixed policy is slower than float32 (a CPU,
    # as here); Keras's own call is silent on any machine.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with caplog.at_level(logging.INFO):
            keras.config.set_dtype_policy("mixed_float16")
    assert caught == []
    assert caplog.records == []
    assert capsys.readouterr() == ("", "")


@describes("3.15", "3.16")
@pytest.mark.backend_independent
def test_stock_checkpoint_callbacks_write_on_a_worker_that_is_not_chief(
    monkeypatch, tmp_path
):
    # The same worker as test_non_chief_workers_do_not_write_checkpoints:
    # task 1 of 2. Keras's callbacks have no notion of a chief.
    monkeypatch.setenv(
        "TF_CONFIG",
        '{"cluster": {"worker": ["h:1", "h:2"]}, '
        '"task": {"type": "worker", "index": 1}}',
    )
    model = mlp()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    x, y = classification_data(n=32)
    callbacks = [
        keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras")),
        keras.callbacks.BackupAndRestore(
            str(tmp_path / "backup"), delete_checkpoint=False
        ),
    ]
    model.fit(x, y, batch_size=16, verbose=0, callbacks=callbacks)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup", "m.keras"]
    assert any((tmp_path / "backup").iterdir())


def _ops_per_apply(optimizer, n):
    """The aten ops one eager `apply` of `optimizer` dispatches, by name,
    for `n` gradients."""
    variables = [keras.Variable(np.ones((3, 2), "float32")) for _ in range(n)]
    optimizer.build(variables)
    grads = [
        ops.convert_to_tensor(np.full((3, 2), 4.0, "float32")) for _ in range(n)
    ]
    # The gradients stand for a scaled loss's: a loop that scales says so
    # (kmp's scaler applies others unscaled, with no division to count).
    optimizer.scale_loss(1.0)
    optimizer.apply(grads, variables)  # builds what a first step builds
    optimizer.scale_loss(1.0)
    calls = torch_calls(lambda: optimizer.apply(grads, variables))
    return collections.Counter(
        func.overloadpacket.__name__ for func, _, _ in calls
    )


def _ops_per_gradient(make):
    """The ops one more gradient adds to an `apply`."""
    two, four = _ops_per_apply(make(), 2), _ops_per_apply(make(), 4)
    return {op: (four[op] - two[op]) / 2 for op in four if four[op] > two[op]}


@describes("3.15", "3.16")
@torch_only
def test_stock_scaler_checks_and_divides_each_gradient_with_its_own_ops():
    # Per gradient, the stock scaler runs `isfinite` (on a CPU torch
    # composes it of abs, ne, eq and mul), `all` and a divide: each a
    # pass over the gradient, and on a GPU a kernel launch. kmp's scaler
    # copies the gradients (Keras's are read-only) in one multi-tensor op
    # and checks and unscales them all in one multi-tensor kernel,
    # PyTorch GradScaler's: no op of its own per gradient.
    stock = _ops_per_gradient(lambda: _stock(initial_scale=4.0))
    assert stock["all"] == stock["div"] == 1
    assert sum(stock.values()) >= 3
    ours = _ops_per_gradient(
        lambda: kmp.LossScaleOptimizer(
            keras.optimizers.SGD(0.1), initial_scale=4.0
        )
    )
    # Nor does SGD's update (one `torch._foreach_*` op over all of them).
    assert ours == {}
    fused = "_amp_foreach_non_finite_check_and_unscale_"
    for n in (2, 4):
        optimizer = kmp.LossScaleOptimizer(
            keras.optimizers.SGD(0.1), initial_scale=4.0
        )
        assert _ops_per_apply(optimizer, n)[fused] == 1


@describes("3.15", "3.16")
def test_stock_keras_loads_a_mixed_model_s_file_without_its_optimizer_state(
    tmp_path,
):
    # Saved after two steps under the scaler Keras's compile added; loaded
    # under float32, as a new process would: a plain Adam at iteration 0,
    # no loss scale, its slots fresh (Keras's one warning is all).
    path = str(tmp_path / "m.keras")
    assert saved_under_keras_s_scaler(path) == 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = keras.saving.load_model(path)
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)  # torch's too
    assert not isinstance(loaded.optimizer, keras.optimizers.LossScaleOptimizer)
    assert int(loaded.optimizer.iterations) == 0
    assert any("Skipping variable loading" in str(w.message) for w in caught)


@describes("3.15", "3.16")
def test_stock_remat_recomputes_outside_the_policy_on_tensorflow_and_torch():
    # keras-team/keras#21448: `keras.RematScope` recomputes a layer in the
    # backward pass outside its autocast scope, so its kernel is read as
    # the float32 variable. On TensorFlow and torch the step then fails
    # (a dtype mismatch: loud, not silent); on JAX the recomputation is
    # traced inside the layer's call and computes in float16 throughout.
    # The memory work's `--remat` starts from this answer (issue 33).
    DtypeRecordingDense.seen = []
    kmp.enable("mixed_float16")
    with keras.RematScope(mode="full"):
        inputs = keras.Input((8,))
        x = DtypeRecordingDense(16, activation="relu")(inputs)
        x = DtypeRecordingDense(16, activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Dense(1, dtype="float32")(x))
    model.compile(optimizer="sgd", loss="mse")
    DtypeRecordingDense.seen = []
    x, y = np.ones((8, 8), "float32"), np.ones((8, 1), "float32")
    if backend.name() == "jax":
        model.fit(x, y, batch_size=8, verbose=0)
        assert set(DtypeRecordingDense.seen) == {("float16", "float16")}
        assert len(DtypeRecordingDense.seen) == 4  # 2 layers, 2 passes
        return
    with pytest.raises(Exception, match="float32|float16") as raised:
        model.fit(x, y, batch_size=8, verbose=0)
    assert type(raised.value).__name__ in ("TypeError", "CheckpointError")
    assert ("float16", "float32") in DtypeRecordingDense.seen


def _dropout_block_fit(remat_mode):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    with keras.RematScope(mode=remat_mode):
        block = DropoutBlock()
    model = keras.Model(inputs, block(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x = np.linspace(-1, 1, 128, dtype="float32").reshape(16, 8)
    model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0, shuffle=False)
    return [ops.convert_to_numpy(w) for w in model.weights]


@describes("3.15", "3.16")
def test_stock_remat_fails_or_recomputes_another_dropout_mask():
    # BUILD_NOTES defect 30: a block with dropout made under
    # `keras.RematScope`. TensorFlow refuses it (`recompute_grad` takes no
    # keyword arguments in a graph, and Keras passes `training=` as
    # one); on JAX, Keras 3.15 traces `training` and the layer's `if
    # training:` fails on the tracer, and Keras 3.16 keeps a bool
    # `training` out of the trace, but the dropout's seed generator
    # advances inside `jax.checkpoint` and leaks its tracer; torch
    # trains, but recomputes the dropout mask from the seed its forward
    # pass advanced (and the moving statistics twice): the weights
    # differ from the same run without remat, silently.
    # kmp.rematerialize runs all three as without remat
    # (tests/memory/remat_test.py).
    if backend.name() == "tensorflow":
        with pytest.raises(ValueError, match="keywords arguments"):
            _dropout_block_fit("full")
        return
    if backend.name() == "jax":
        if backend.keras_version() < (3, 16):
            with pytest.raises(Exception, match="DropoutBlock.call"):
                _dropout_block_fit("full")
            return
        with pytest.raises(Exception, match="unexpected tracer") as raised:
            _dropout_block_fit("full")
        assert type(raised.value).__name__ == "UnexpectedTracerError"
        assert "seed_generator" in str(raised.value)
        return
    plain = _dropout_block_fit(None)
    recomputed = _dropout_block_fit("full")
    apart = max(float(np.abs(a - b).max()) for a, b in zip(plain, recomputed))
    assert apart > 1e-3


@describes("3.15", "3.16")
@tf_only
def test_stock_scaler_skips_an_optimizer_s_own_apply_gradients():
    # TensorFlow's fit calls apply_gradients (in float32 the override
    # keeps the first kernel's column means, `CentralizedSGD`); the
    # scaler Keras adds under mixed_float16 calls the inner `apply`.
    keras.config.set_dtype_policy("mixed_float16")
    model = mlp()
    means = ops.convert_to_numpy(ops.mean(model.weights[0], axis=0))
    model.compile(
        optimizer=CentralizedSGD(0.1), loss="sparse_categorical_crossentropy"
    )
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    model.fit(*classification_data(), batch_size=32, epochs=1, verbose=0)
    moved = np.abs(np.mean(model.get_weights()[0], axis=0) - means).max()
    assert moved > 1e-3


@describes("3.15", "3.16")
@tf_only
def test_stock_top_k_metrics_refuse_a_float16_output():
    # keras-io's vision examples compile SparseTopKCategoricalAccuracy:
    # TensorFlow's in_top_k takes float32 predictions only, and Keras
    # passes the model's float16 logits on (a helper's runs, 2026-11-30).
    keras.config.set_dtype_policy("mixed_float16")
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(8)(inputs))
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseTopKCategoricalAccuracy(5)],
    )
    x, y = np.ones((16, 4), "float32"), np.arange(16) % 8
    with pytest.raises(TypeError, match="'InTopKV2' Op has type float16"):
        model.fit(x, y, verbose=0)
    # kmp's outputs are float32 (a subclassed model's cast):
    # test_an_unbuilt_subclassed_model_is_pinned_once_built.
    kmp.enable("mixed_float16")
    inputs = keras.Input((4,))
    model = kmp.pin_float32(keras.Model(inputs, keras.layers.Dense(8)(inputs)))
    model.compile(
        optimizer=kmp.wrap("sgd"),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseTopKCategoricalAccuracy(5)],
    )
    assert np.isfinite(model.fit(x, y, verbose=0).history["loss"][-1])


@describes("3.15", "3.16")
def test_stock_orbax_checkpoint_loses_a_resumed_run_s_saves(tmp_path):
    # Keras's callback numbers a resumed run's saves from `iterations`,
    # which its scaler does not advance on a skipped step: below the
    # steps on disk, they are never written (JAX, silently), or the run
    # fails at its first (TensorFlow, torch). kmp's: orbax_checkpoint_test.
    from orbax.checkpoint.experimental.v1.training import errors
    from orbax_runs import compiled_model
    from orbax_runs import fit
    from orbax_runs import steps

    keras.config.set_dtype_policy("mixed_float16")
    directory = str(tmp_path / "ckpt")
    stock = keras.optimizers.LossScaleOptimizer
    model = compiled_model(stock)
    fit(model, 10, directory, keras.callbacks.OrbaxCheckpoint)
    assert int(model.optimizer.iterations) < 10  # steps were skipped
    restored = keras.saving.load_model(directory)
    try:
        fit(restored, 6, directory, keras.callbacks.OrbaxCheckpoint)
    except errors.StepAlreadyExistsError:
        assert backend.name() != "jax"
    assert steps(directory) == [6, 8, 10]  # none of the resumed run's


@keras.saving.register_keras_serializable(package="kmp_tests")
class Subclassed(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.head = keras.layers.Dense(2, name="head")

    def call(self, x):
        return self.head(x)


def test_stock_orbax_load_gives_a_subclassed_model_its_initial_weights(
    tmp_path,
):
    # `fit` builds a subclassed model inside its name scope, Keras's load
    # outside: saved "subclassed/head/kernel", made "head/kernel", and
    # `set_state_tree` assigns by path, so nothing is restored, without a
    # word (keras-team/keras#23251, of a Sequential model, which
    # 3.16.0.dev2026102704 loads whole on TensorFlow and torch). kmp's:
    # checkpoint_dirs_test.
    keras.config.set_dtype_policy("float32")
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    model = Subclassed()
    model.compile(optimizer="adam", loss="mse")
    directory = str(tmp_path / "ckpt")
    checkpoint = keras.callbacks.OrbaxCheckpoint(
        directory, save_on_background=False
    )
    model.fit(x, x[:, :2], verbose=0, callbacks=[checkpoint])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = keras.saving.load_model(directory)
    assert not [w for w in caught if "/keras/" in w.filename]
    assert restored.weights[0].path != model.weights[0].path
    trained = ops.convert_to_numpy(model.weights[0])
    assert not np.array_equal(
        ops.convert_to_numpy(restored.weights[0]), trained
    )
    kmp_restored = kmp.load_model(directory)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(kmp_restored.weights[0]), trained
    )
