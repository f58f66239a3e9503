"""16-bit optimizer state (`kmp.wrap(..., state_dtype="bfloat16")`): the
slots are stored in bfloat16, the update computed in float32; the run
stays close to float32 state; a `.keras` file keeps the mode, in this
process and a fresh one; defaults unchanged.

16-bit master weights (`kmp.enable("mixed_bfloat16",
master_weights="bfloat16")`): rounded to nearest, small updates vanish
and the run stalls; rounded stochastically it follows float32, the same
under a seed, and weight decay still acts."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from util import JIT_COMPILE

import kmp
from kmp import backend
from kmp.memory import optimizer_state

OPTIMIZERS = {
    "Adam": lambda: keras.optimizers.Adam(1e-2),
    "AdamW": lambda: keras.optimizers.AdamW(1e-2, weight_decay=0.1),
    "SGD": lambda: keras.optimizers.SGD(1e-1, momentum=0.9),
    "Lion": lambda: keras.optimizers.Lion(1e-3),
    "Adagrad": lambda: keras.optimizers.Adagrad(1e-1),
    "Lamb": lambda: keras.optimizers.Lamb(1e-2),
    "Muon": lambda: keras.optimizers.Muon(1e-2),
}
# Muon orthogonalizes its momentum (Newton-Schulz) before a step: the
# direction of a small matrix's update moves with the momentum's
# rounding more than an elementwise optimizer's does (3.6 % here).
_APART = {"Muon": 0.05}


def _data():
    rng = np.random.default_rng(0)
    return rng.random((64, 8), "float32"), rng.random((64, 4), "float32")


def _model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])


def _trained(optimizer, steps=4):
    model = _model()
    model.compile(optimizer, "mse", jit_compile=JIT_COMPILE[0])
    x, y = _data()
    model.fit(x, y, batch_size=16, epochs=1, steps_per_epoch=steps, verbose=0)
    return model


def _slot_dtypes(optimizer):
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return {
        str(v.dtype)
        for v in inner.variables
        if tuple(v.shape) in ((8, 4), (4,))  # the slots of the weights
    }


def _same_state_and_resumes(model, loaded):
    """`loaded`'s optimizer holds `model`'s values, and trains 2 steps."""
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(keras.ops.cast(a, "float32")),
            keras.ops.convert_to_numpy(keras.ops.cast(b, "float32")),
        )
    x, y = _data()
    loaded.fit(x, y, batch_size=16, epochs=1, steps_per_epoch=2, verbose=0)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_slots_are_bfloat16_and_the_run_follows_float32_state(name):
    reference = _trained(OPTIMIZERS[name]())
    optimizer = kmp.wrap(OPTIMIZERS[name](), state_dtype="bfloat16")
    model = _trained(optimizer)
    assert type(optimizer).__name__ == f"LowPrecision{name}"
    assert _slot_dtypes(optimizer) == {"bfloat16"}
    assert _slot_dtypes(reference.optimizer) == {"float32"}
    assert {str(w.dtype) for w in model.weights} == {"float32"}
    # Four steps: the weights moved as float32 state moved them, to
    # bfloat16's rounding of the slots (2^-8 relative).
    start = _model().get_weights()[0]
    moved = np.abs(reference.get_weights()[0] - start).max()
    apart = np.abs(model.get_weights()[0] - reference.get_weights()[0]).max()
    bound = _APART.get(name, 0.02)
    assert moved > 0.003 and apart < bound * moved, (moved, apart)


def test_adafactor_keeps_its_factored_statistics_and_rounds_the_rest():
    # Adafactor makes a weight's row and column statistics itself, in
    # the weight's dtype (rows + columns of them, not rows x columns);
    # its full-size slot comes from the weight, in bfloat16.
    reference = _trained(keras.optimizers.Adafactor(1e-2))
    optimizer = kmp.wrap(keras.optimizers.Adafactor(1e-2), "bfloat16")
    model = _trained(optimizer)
    dtypes = {tuple(v.shape): str(v.dtype) for v in optimizer.variables}
    assert dtypes[(8, 4)] == "bfloat16"  # the kernel's velocity
    assert dtypes[(8,)] == "float32"  # its row statistics
    start = _model().get_weights()[0]
    moved = np.abs(reference.get_weights()[0] - start).max()
    apart = np.abs(model.get_weights()[0] - reference.get_weights()[0]).max()
    assert moved > 0.003 and apart < 0.02 * moved, (moved, apart)


def test_the_state_takes_half_the_bytes_and_an_average_stays_float32():
    parameters = 8 * 4 + 4
    plain = _trained(keras.optimizers.Adam(1e-2, use_ema=True))
    half = _trained(
        kmp.wrap(
            keras.optimizers.Adam(1e-2, use_ema=True), state_dtype="bfloat16"
        )
    )
    saved = (
        backend.state_bytes(plain)["optimizer_state"]
        - backend.state_bytes(half)["optimizer_state"]
    )
    assert saved == 2 * 2 * parameters  # two slots, 4 -> 2 bytes each
    averages = [v for v in half.optimizer.variables if "average" in v.path]
    assert averages and {str(v.dtype) for v in averages} == {"float32"}


def test_under_kmp_s_scaler_the_file_keeps_the_mode_and_resumes(tmp_path):
    kmp.enable("mixed_float16")
    model = _trained(
        kmp.wrap(keras.optimizers.AdamW(1e-2), state_dtype="bfloat16")
    )
    assert isinstance(model.optimizer, kmp.LossScaleOptimizer)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = kmp.load_model(path)
    inner = loaded.optimizer.inner_optimizer
    assert type(inner).__name__ == "LowPrecisionAdamW"
    assert optimizer_state.state_dtype_of(inner) == "bfloat16"
    assert _slot_dtypes(loaded.optimizer) == {"bfloat16"}
    _same_state_and_resumes(model, loaded)
    assert int(inner.iterations) == 6


@pytest.mark.slow
def test_a_fresh_process_loads_the_file(tmp_path):
    path = str(tmp_path / "m.keras")
    _trained(
        kmp.wrap(keras.optimizers.Adam(1e-2), state_dtype="bfloat16")
    ).save(path)
    code = (
        "import sys, keras, kmp\n"
        "m = keras.saving.load_model(sys.argv[1])\n"
        "print(type(m.optimizer).__name__, sorted({str(v.dtype) for v in "
        "m.optimizer.variables}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, path],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert "LowPrecisionAdam" in done.stdout and "bfloat16" in done.stdout


def test_defaults_and_float32_leave_the_optimizer_as_it_was():
    # Once built on float32 weights: until then the default rounding
    # waits for the weights' dtype (`kmp.memory.modes`).
    for state_dtype in (None, "float32"):
        optimizer = keras.optimizers.Adam()
        kind = type(optimizer)
        assert kmp.wrap(optimizer, state_dtype=state_dtype) is optimizer
        optimizer.build([keras.Variable(np.ones((2,), "float32"))])
        assert type(optimizer) is kind
        assert "_state_dtype" not in vars(optimizer)
    optimizer = keras.optimizers.Adam()
    kind = type(optimizer)
    kmp.wrap(optimizer, rounding="nearest")
    assert type(optimizer) is kind  # asked for Keras's rounding: at once


def _stall_run(
    master_weights, rounding=None, seed=3, stock=False, state_dtype=None
):
    """A weight of 1 pulled towards 1.5 by steps of ~8e-4, a tenth of
    bfloat16's step at 1 (2**-7): 160 SGD steps of batch 32."""
    kmp.enable("mixed_bfloat16", master_weights=master_weights)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(1, use_bias=False, kernel_initializer="ones"),
        ]
    )
    optimizer = keras.optimizers.SGD(2e-4)
    if not stock:
        optimizer = kmp.wrap(
            optimizer, state_dtype, rounding=rounding, seed=seed
        )
        kmp_s = master_weights == "bfloat16"  # float32: Keras's own SGD
        assert (type(optimizer).__name__ == "LowPrecisionSGD") == kmp_s
    model.compile(optimizer, "mse", jit_compile=JIT_COMPILE[0])
    rng = np.random.default_rng(0)
    x = rng.random((160 * 32, 16), "float32")
    model.fit(x, x.sum(1) * 1.5, batch_size=32, verbose=0, shuffle=False)
    kernel = model.weights[0]
    assert str(kernel.dtype) == master_weights
    return keras.ops.convert_to_numpy(keras.ops.cast(kernel, "float32"))


def test_bfloat16_masters_stall_rounded_to_nearest_and_learn_stochastically():
    float32 = _stall_run("float32").mean()
    assert 1.10 < float32 < 1.13  # moved ~0.115: about 15 bfloat16 steps
    # Every update is under half a step: rounded to nearest, none lands,
    # with kmp's float32 update and with Keras's own.
    # (float32 state: SGD has no slots, but it keeps kmp's class.)
    assert np.all(
        _stall_run("bfloat16", "nearest", state_dtype="float32") == 1.0
    )
    assert np.all(_stall_run("bfloat16", stock=True) == 1.0)
    stochastic = _stall_run("bfloat16").mean()  # the default rounding
    assert abs(stochastic - float32) < 0.1 * (float32 - 1.0)


def test_stochastic_rounding_is_the_same_under_a_seed():
    first = _stall_run("bfloat16", seed=3)
    np.testing.assert_array_equal(first, _stall_run("bfloat16", seed=3))
    assert not np.array_equal(first, _stall_run("bfloat16", seed=4))


def _decayed(rounding):
    """100 AdamW steps on zero gradients: only the decay moves the
    weights, by a factor 1 - 1e-4 per step (1e-4 of a weight of 1 is
    1/78 of a bfloat16 step)."""
    kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    weights = keras.Variable(np.ones((64, 64), "float32"), dtype="bfloat16")
    optimizer = kmp.wrap(
        keras.optimizers.AdamW(1e-2, weight_decay=1e-2), rounding=rounding
    )
    optimizer.build([weights])
    for _ in range(100):
        optimizer.apply([keras.ops.zeros((64, 64), "bfloat16")], [weights])
    return keras.ops.convert_to_numpy(keras.ops.cast(weights, "float32"))


def test_weight_decay_acts_on_bfloat16_masters():
    assert np.all(_decayed("nearest") == 1.0)
    assert abs(_decayed("stochastic").mean() - (1 - 1e-4) ** 100) < 3e-4


def test_bfloat16_masters_keep_slots_as_asked_and_the_file_keeps_the_mode(
    tmp_path,
):
    kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    default = _trained(kmp.wrap(keras.optimizers.Adam(1e-2)))
    assert optimizer_state.rounding_of(default.optimizer) == "stochastic"
    assert _slot_dtypes(default.optimizer) == {"bfloat16"}  # as the weights
    wide = _trained(
        kmp.wrap(keras.optimizers.Adam(1e-2), state_dtype="float32")
    )
    assert _slot_dtypes(wide.optimizer) == {"float32"}
    # Weights 2 bytes a parameter; Adam's two slots 2 + 2 or 4 + 4.
    parameters = 8 * 4 + 4
    assert backend.state_bytes(default)["weights"] == 2 * parameters
    saved = (
        backend.state_bytes(wide)["optimizer_state"]
        - backend.state_bytes(default)["optimizer_state"]
    )
    assert saved == 2 * 2 * parameters
    path = str(tmp_path / "m.keras")
    default.save(path)
    loaded = kmp.load_model(path)
    assert {str(w.dtype) for w in loaded.weights} == {"bfloat16"}
    assert optimizer_state.rounding_of(loaded.optimizer) == "stochastic"
    _same_state_and_resumes(default, loaded)
    assert int(loaded.optimizer.iterations) == 6


def test_bad_requests_are_one_clear_error():
    with pytest.raises(kmp.InputError, match="float16's range"):
        kmp.wrap(keras.optimizers.Adam(), state_dtype="float16")

    class OwnAdam(keras.optimizers.Adam):
        pass

    with pytest.raises(kmp.InputError, match="rounding='up'"):
        kmp.wrap(keras.optimizers.Adam(), rounding="up")
    with pytest.raises(kmp.InputError, match="Keras's own optimizers"):
        kmp.wrap(OwnAdam(), state_dtype="bfloat16")
    with pytest.raises(kmp.InputError, match="not offered for Schedule"):
        kmp.wrap(keras.optimizers.ScheduleFreeAdamW(), state_dtype="bfloat16")
    built = _trained(keras.optimizers.Adam()).optimizer
    with pytest.raises(kmp.InputError, match="is built"):
        kmp.wrap(built, state_dtype="bfloat16")


def _second_moment_after_a_change(optimizer):
    """Adam's second moment of a 64x64 weight, settled at 1 (gradients of
    1), after 100 steps of gradients of 1.2: float32 moves it to
    1.44 - 0.44 * 0.999**100 = 1.0419, by 0.00044 a step at first: a
    twentieth of bfloat16's step at 1."""
    dtype = keras.config.dtype_policy().variable_dtype
    weights = keras.Variable(np.ones((64, 64)), dtype=dtype)
    optimizer.build([weights])
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    inner.iterations.assign(100_000)  # bias corrections ~1
    for slot in (inner._momentums[0], inner._velocities[0]):
        slot.assign(np.ones((64, 64), "float32"))
    for _ in range(100):
        optimizer.apply([keras.ops.full((64, 64), 1.2)], [weights])
    velocity = inner._velocities[0]
    return str(velocity.dtype), keras.ops.convert_to_numpy(
        keras.ops.cast(velocity, "float32")
    )


def test_a_bfloat16_second_moment_follows_float32_where_nearest_freezes():
    expected = 1.44 - 0.44 * 0.999**100
    dtype, float32 = _second_moment_after_a_change(keras.optimizers.Adam(1e-6))
    assert dtype == "float32" and abs(float32.mean() - expected) < 1e-4
    dtype, ours = _second_moment_after_a_change(
        kmp.wrap(keras.optimizers.Adam(1e-6), state_dtype="bfloat16")
    )
    assert dtype == "bfloat16" and abs(ours.mean() - expected) < 2e-3
    # Keras's own optimizer over bfloat16 variables: slots in bfloat16,
    # each write rounded to nearest: the moment never moves.
    kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    dtype, stock = _second_moment_after_a_change(keras.optimizers.Adam(1e-6))
    assert dtype == "bfloat16" and np.all(stock == 1.0)


def test_a_second_build_keeps_what_the_first_decided():
    # Keras's `build` returns at once when built; kmp's must keep its
    # maps too (which writes round stochastically, what a group widens).
    kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    model = _trained(kmp.wrap(keras.optimizers.Adam(1e-2)))
    optimizer = model.optimizer
    places, widened = optimizer._rounding_places, optimizer._bfloat16_of
    assert len(places) == 2 + 2 * 2 and all(map(len, widened.values()))
    optimizer.build(model.trainable_variables)
    assert optimizer._rounding_places == places
    assert optimizer._bfloat16_of == widened
