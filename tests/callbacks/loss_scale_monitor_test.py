"""kmp.callbacks.LossScaleMonitor (and StepCount): the loss scale and
the skipped steps in fit's logs, and the stop for a run no loss scale
can save."""

import csv
import glob
import itertools
import warnings

import keras
import keras_io_steps
import numpy as np
import pytest
from keras import ops
from util import JIT_COMPILE
from util import classification_data
from util import mlp
from util import nnx_only
from util import run_under_nnx
from util import tf_only

import kmp
from kmp import backend
from kmp.callbacks import loss_scale_monitor


def _fit(optimizer, callbacks, jit_compile=JIT_COMPILE[0], epochs=2):
    model = mlp()
    model.compile(
        optimizer=optimizer,
        loss="sparse_categorical_crossentropy",
        jit_compile=jit_compile,
    )
    x, y = classification_data()
    history = model.fit(
        x, y, batch_size=32, epochs=epochs, verbose=0, callbacks=callbacks
    )
    return model, history


@pytest.mark.parametrize("jit_compile", JIT_COMPILE)
def test_fit_logs_loss_scale_and_skipped_steps(jit_compile):
    kmp.enable("mixed_float16")
    # 2**30 overflows float16 gradients: the first steps are skipped.
    optimizer = kmp.wrap(
        keras.optimizers.Adam(1e-2), initial_scale=2.0**30, max_scale=2.0**30
    )
    monitor = kmp.callbacks.LossScaleMonitor()
    model, history = _fit(optimizer, [monitor], jit_compile, epochs=3)

    skipped = int(optimizer.skipped_steps)
    assert 0 < skipped < 24
    assert history.history["skipped_steps"][-1] == skipped
    assert history.history["loss_scale"][-1] == float(optimizer.loss_scale)
    assert history.history["loss"][-1] < history.history["loss"][0]

    per_step = monitor.history
    assert len(per_step["loss_scale"]) == 24  # 3 epochs x 8 steps
    assert per_step["epoch"] == sorted(per_step["epoch"])
    assert per_step["skipped_steps"] == sorted(per_step["skipped_steps"])
    assert per_step["skipped_steps"][-1] == skipped
    # Each skipped step halved the scale, and nothing else changed it
    # (growth comes after 2000 finite steps): after every step the scale
    # is 2**30 halved once per step skipped so far.
    assert per_step["loss_scale"][0] == 2.0**29
    assert per_step["loss_scale"] == [
        2.0**30 / 2.0**s for s in per_step["skipped_steps"]
    ]


@pytest.mark.skipif(backend.is_stateless(), reason="JAX steps are pure")
def test_a_step_s_logged_values_do_not_change_with_later_steps():
    # When every callback is async_safe, Keras reads batch-end logs on a
    # thread pool (torch, JAX), possibly steps later. Torch assigns
    # variables in place, so a log that were the variable's own tensor
    # would then show a later step's scale.
    kmp.enable("mixed_float16")
    model = mlp()
    model.compile(
        optimizer=kmp.wrap(
            keras.optimizers.SGD(0.0), initial_scale=2.0, dynamic_growth_steps=1
        ),
        loss="sparse_categorical_crossentropy",
    )
    model.optimizer.build(model.trainable_variables)
    kmp.callbacks.LossScaleMonitor().set_model(model)  # wraps train_step
    x, y = classification_data(n=32)
    first = model.train_step((x, y))
    second = model.train_step((x, y))
    assert float(first["loss_scale"]) == 4.0  # the scale doubles per step
    assert float(second["loss_scale"]) == 8.0


def test_every_callback_sees_the_values_whatever_its_position(tmp_path):
    kmp.enable("mixed_float16")
    path = str(tmp_path / "log.csv")
    logger = keras.callbacks.CSVLogger(path)
    _fit(kmp.wrap("adam"), [logger, kmp.callbacks.LossScaleMonitor()])
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    assert float(rows[-1]["loss_scale"]) == 2.0**15
    assert float(rows[-1]["skipped_steps"]) == 0
    # The stop rule's streak, as the docstring says: a callback before
    # the monitor writes it too, unless the monitor comes first or keeps
    # no stop rule.
    assert "overflow_streak" in rows[-1]
    for monitor_first in (True, False):
        logger = keras.callbacks.CSVLogger(path)
        if monitor_first:
            callbacks = [kmp.callbacks.LossScaleMonitor(), logger]
        else:
            monitor = kmp.callbacks.LossScaleMonitor(stop_after=None)
            callbacks = [logger, monitor]
        _fit(kmp.wrap("adam"), callbacks)
        with open(path) as f:
            columns = next(csv.DictReader(f)).keys()
        assert "loss_scale" in columns and "overflow_streak" not in columns


@tf_only
def test_tensorboard_gets_loss_scale_scalars(tmp_path):
    import tensorflow as tf

    kmp.enable("mixed_float16")
    board = keras.callbacks.TensorBoard(str(tmp_path))
    _fit(kmp.wrap("adam"), [board, kmp.callbacks.LossScaleMonitor()])
    tags = set()
    for path in glob.glob(str(tmp_path / "train" / "events*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in event.summary.value)
    assert {"epoch_loss_scale", "epoch_skipped_steps"} <= tags


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "float32"])
def test_monitor_is_a_no_op_without_loss_scaling(policy):
    kmp.enable(policy)
    monitor = kmp.callbacks.LossScaleMonitor()
    _, history = _fit(kmp.wrap("adam"), [monitor])
    assert "loss_scale" not in history.history
    assert monitor.history["loss_scale"] == []


def test_monitor_reports_stock_keras_scale_without_skip_count():
    kmp.enable("mixed_float16")
    stock = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    _, history = _fit(stock, [kmp.callbacks.LossScaleMonitor()])
    assert history.history["loss_scale"] == [2.0**15, 2.0**15]
    assert "skipped_steps" not in history.history


def test_monitor_retraces_an_already_compiled_train_function():
    kmp.enable("mixed_float16")
    model = mlp()
    model.compile(
        optimizer=kmp.wrap("adam"), loss="sparse_categorical_crossentropy"
    )
    x, y = classification_data()
    model.fit(x, y, verbose=0)  # builds a train function without the monitor
    monitor = kmp.callbacks.LossScaleMonitor()
    history = model.fit(x, y, verbose=0, callbacks=[monitor])
    assert history.history["loss_scale"] == [2.0**15]
    model.fit(x, y, verbose=0, callbacks=[monitor])  # a new record per fit
    assert len(monitor.history["loss_scale"]) == 8


def test_step_count_is_a_float_that_the_progress_bar_shows_as_an_integer():
    count = kmp.callbacks.StepCount(3.0)
    assert count == 3.0 and isinstance(count, float)
    # Keras's Progbar divides by 1, then formats with .4f or .4e.
    assert f"{count / 1:.4e}" == "3"
    assert f"{kmp.callbacks.StepCount(0.0) / 1:.4f}" == "0"
    assert float(count) + 1 == 4.0


def test_progress_bar_shows_skipped_steps_as_a_count(capsys):
    kmp.enable("mixed_float16")
    model = mlp()
    model.compile(kmp.wrap("adam"), "sparse_categorical_crossentropy")
    x, y = classification_data()
    model.fit(
        x,
        y,
        batch_size=32,
        epochs=1,
        verbose=1,
        callbacks=[kmp.callbacks.LossScaleMonitor()],
    )
    shown = capsys.readouterr().out
    assert "skipped_steps: 0" in shown
    assert "e+00" not in shown


def _nan_fit(stop_after, epochs=3):
    """A float16 model whose data holds a NaN: every gradient is
    non-finite, whatever the scale."""
    kmp.enable("mixed_float16")
    model = mlp()
    optimizer = kmp.wrap("sgd", initial_scale=4.0, min_scale=1.0)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    x, y = classification_data()
    x[:, 0] = np.nan
    monitor = kmp.callbacks.LossScaleMonitor(stop_after=stop_after)
    history = model.fit(
        x,
        y,
        batch_size=32,
        epochs=epochs,
        verbose=0,
        callbacks=[monitor, _InStepOrder()],
    )
    return optimizer, monitor, history


class _InStepOrder(keras.callbacks.Callback):
    """A batch-end callback that is not async-safe: Keras then runs every
    batch-end callback before the next step, so a stop comes at the very
    step that asked for it (on a thread pool it may come a step later)."""

    def on_train_batch_end(self, batch, logs=None):
        pass


def test_a_run_no_loss_scale_can_save_stops_with_the_reason():
    with pytest.warns(RuntimeWarning, match="5 steps in a row") as caught:
        optimizer, monitor, history = _nan_fit(stop_after=5)
    # Scale 4 -> 2 -> 1 on the first two skips, then at its floor: the
    # fifth skip in a row is the last step run.
    assert int(optimizer.skipped_steps) == 5
    assert int(optimizer.iterations) == 0
    assert monitor.history["loss_scale"] == [2.0, 1.0, 1.0, 1.0, 1.0]
    assert "kmp doctor" in monitor.stop_reason
    assert monitor.stop_reason in [str(w.message) for w in caught]
    assert "overflow_streak" not in history.history


def _epoch_lines(caught):
    messages = [str(w.message) for w in caught]
    return [m for m in messages if "applied no update" in m]


@pytest.mark.parametrize(
    "in_step_order, steps_per_execution",
    [
        (True, 1),
        (False, 1),
        pytest.param(
            True,
            3,
            marks=pytest.mark.skipif(
                backend.name() == "torch",
                reason="Keras's torch fit runs one step an execution",
            ),
        ),
    ],
)
def test_an_epoch_with_every_step_skipped_warns_once_before_the_stop(
    in_step_order, steps_per_execution
):
    # The monitor alone is async-safe: on JAX and torch Keras then runs
    # its batch-end calls on a thread pool. Three steps an execution:
    # 8 steps run as 3 + 3 + 2, and Keras's last batch end says step 8.
    kmp.enable("mixed_float16")
    model = mlp()
    optimizer = kmp.wrap("sgd", initial_scale=4.0, min_scale=1.0)
    model.compile(
        optimizer=optimizer,
        loss="sparse_categorical_crossentropy",
        steps_per_execution=steps_per_execution,
    )
    x, y = classification_data()
    x[:, 0] = np.nan
    monitor = kmp.callbacks.LossScaleMonitor()
    callbacks = [monitor] + ([_InStepOrder()] if in_step_order else [])
    with pytest.warns(RuntimeWarning, match="applied no update") as caught:
        model.fit(x, y, batch_size=32, epochs=3, verbose=0, callbacks=callbacks)
    lines = _epoch_lines(caught)
    assert len(lines) == 1  # once per fit, not for epochs 2 and 3
    assert "epoch 1 applied no update: all 8 of its updates had" in lines[0]
    assert "now 1 (min_scale=1)" in lines[0]
    assert "stops after 100 such steps" in lines[0]
    assert monitor.stop_reason is None  # 24 of 100: fit went on
    assert int(optimizer.skipped_steps) == 24


def test_an_epoch_that_took_a_step_or_a_stop_gets_no_epoch_line():
    kmp.enable("mixed_float16")
    # 2**20 overflows the first steps' float16 gradients (this model's
    # last finite scale is 2**17); the scale falls within the first epoch
    # and its later steps apply.
    optimizer = kmp.wrap(
        keras.optimizers.Adam(1e-2), initial_scale=2.0**20, max_scale=2.0**20
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(optimizer, [kmp.callbacks.LossScaleMonitor()], epochs=2)
    assert 0 < int(optimizer.skipped_steps) < 8
    assert _epoch_lines(caught) == []
    # A stop within the epoch says it all: no second line at its end.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, monitor, _ = _nan_fit(stop_after=5)
    assert monitor.stop_reason is not None
    assert _epoch_lines(caught) == []


def test_stop_after_none_skips_to_the_end_and_bad_values_are_refused():
    optimizer, monitor, _ = _nan_fit(stop_after=None, epochs=2)
    assert int(optimizer.skipped_steps) == 16  # 2 epochs of 8 steps
    assert monitor.stop_reason is None
    for bad in (0, 2.5, True, "10"):
        with pytest.raises(kmp.InputError, match="stop_after must be"):
            kmp.callbacks.LossScaleMonitor(stop_after=bad)


def _gan_fit(images, stop_after=100):
    """keras-io's GAN (TensorFlow's and PyTorch's guides), its losses
    scaled, fitted under the monitor; `compile()` names no optimizer, so
    `model.optimizer` is one no step applies."""
    kmp.enable("mixed_float16")
    gan = keras_io_steps.gan(scale=True)
    gan.compile(
        d_optimizer=kmp.wrap("sgd", initial_scale=4.0, min_scale=1.0),
        g_optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    monitor = kmp.callbacks.LossScaleMonitor(stop_after=stop_after)
    history = gan.fit(
        images,
        batch_size=8,
        epochs=2,
        verbose=0,
        callbacks=[monitor, _InStepOrder()],
    )
    return gan, monitor, history


@pytest.mark.skipif(
    backend.is_stateless(), reason="the guide's GAN is TensorFlow's, torch's"
)
def test_a_gan_s_own_optimizers_are_logged_under_their_names():
    gan, monitor, history = _gan_fit(keras_io_steps.images(n=32))
    assert history.history["d_loss_scale"] == [4.0, 4.0]
    assert history.history["d_skipped_steps"] == [0, 0]
    assert history.history["g_loss_scale"] == [2.0**15, 2.0**15]
    assert "g_skipped_steps" not in history.history  # the stock scaler's
    # Nothing of the RMSprop Keras made at compile(), which no step applies
    # (torch's fit builds it; TensorFlow's does not).
    assert "loss_scale" not in history.history
    per_step = monitor.history
    assert per_step["batch"] == [0, 1, 2, 3] * 2
    assert per_step["d_skipped_steps"] == [0] * 8
    assert per_step["g_skipped_steps"] == [None] * 8
    # Both scalers applied every step.
    assert int(gan.d_optimizer.iterations) == 8
    assert int(gan.g_optimizer.inner_optimizer.iterations) == 8


@pytest.mark.skipif(
    backend.is_stateless(), reason="the guide's GAN is TensorFlow's, torch's"
)
def test_a_gan_s_optimizer_at_its_floor_stops_the_run_by_its_name():
    images = keras_io_steps.images(n=32)
    images[:, 0] = np.nan
    with pytest.warns(RuntimeWarning, match="5 steps in a row") as caught:
        gan, monitor, history = _gan_fit(images, stop_after=5)
    # Scale 4 -> 2 -> 1, then at its floor: the fifth skip is the last.
    assert int(gan.d_optimizer.skipped_steps) == 5
    assert monitor.history["d_loss_scale"] == [2.0, 1.0, 1.0, 1.0, 1.0]
    assert "(self.d_optimizer)" in monitor.stop_reason
    assert monitor.stop_reason in [str(w.message) for w in caught]
    assert "d_overflow_streak" not in history.history
    # Before a stop: the epoch in which the GAN's own optimizer applied
    # nothing, by its name.
    with pytest.warns(RuntimeWarning, match="applied no update") as caught:
        _gan_fit(images)
    (line,) = _epoch_lines(caught)
    assert "epoch 1 applied no update (self.d_optimizer): all 4 of" in line


@pytest.mark.skipif(
    backend.is_stateless(), reason="the guide's GAN is TensorFlow's, torch's"
)
def test_an_optimizer_first_applied_after_the_first_step_is_logged_then():
    # An eager step (torch; TensorFlow with run_eagerly) that updates the
    # generator from its second step on: its scaler is built then, and
    # its entries are the monitor's from there.
    kmp.enable("mixed_float16")
    base = keras_io_steps.gan(scale=True)
    calls = itertools.count()

    class GeneratorLater(type(base)):
        def train_step(self, real_images):
            n = ops.shape(real_images)[0]
            latent = keras.random.normal((n, self.latent_dim), seed=1)
            logs = {
                "d_loss": self._step(
                    self.d_optimizer,
                    lambda: self.loss_fn(
                        ops.ones((n, 1)), self.discriminator(real_images)
                    ),
                    self.discriminator.trainable_weights,
                )
            }
            if next(calls):
                logs["g_loss"] = self._step(
                    self.g_optimizer,
                    lambda: self.loss_fn(
                        ops.zeros((n, 1)),
                        self.discriminator(self.generator(latent)),
                    ),
                    self.generator.trainable_weights,
                )
            return logs

    gan = GeneratorLater(base.discriminator, base.generator, base.latent_dim)
    gan.compile(
        d_optimizer=kmp.wrap("sgd"),
        g_optimizer=kmp.wrap("sgd"),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    gan.run_eagerly = True
    monitor = kmp.callbacks.LossScaleMonitor()
    history = gan.fit(
        keras_io_steps.images(n=32),
        batch_size=8,
        epochs=2,
        verbose=0,
        callbacks=[monitor, _InStepOrder()],
    )
    assert monitor.history["g_loss_scale"] == [None] + [2.0**15] * 7
    assert monitor.history["g_skipped_steps"] == [None] + [0] * 7
    assert history.history["g_skipped_steps"] == [0, 0]
    assert not [k for k in history.history if k.endswith("overflow_streak")]


def test_a_scaler_that_only_skipped_counts_as_applied():
    # With the scale at its floor (or fixed), a skipped step leaves the
    # scale and the update counts as they were: only kmp's skip count
    # tells that a step applied this scaler.
    kmp.enable("mixed_float16")
    variable = keras.Variable([1.0])
    optimizer = kmp.wrap("sgd", initial_scale=1.0, min_scale=1.0)
    optimizer.build([variable])
    assert loss_scale_monitor._never_applied(optimizer)
    optimizer.apply([ops.convert_to_tensor([np.nan])], [variable])
    assert int(optimizer.iterations) == 0 and float(optimizer.loss_scale) == 1
    assert not loss_scale_monitor._never_applied(optimizer)


@nnx_only
def test_fit_logs_the_scale_under_nnx(tmp_path_factory):
    # Keras's compiled fit under NNX runs the class's train_step, not
    # the instance's that carried the logs: History had "loss" only.
    result = run_under_nnx("fit", tmp_path_factory)
    assert result["logs"]["loss_scale"] == [1024.0, 1024.0]
    assert result["logs"]["skipped_steps"] == [0.0, 0.0]
    assert "overflow_streak" not in result["logs"]
    assert result["steps"]["batch"] == [0, 1, 2, 3] * 2
    assert result["steps"]["loss_scale"] == [1024.0] * 8
