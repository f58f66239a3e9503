"""8-bit optimizer state (`kmp.wrap(..., state_dtype="int8")`,
`kmp.memory.quantized_state`; its format is block_codes_test's): the
slots stored as int8 codes with a float32 scale a block, small ones
float32; the run follows float32 state; the bytes;
the file and the backup keep the mode, under kmp's scaler and with
bfloat16 masters."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from util import JIT_COMPILE
from util import script_result

import kmp
from kmp import backend
from kmp.memory import block_codes
from kmp.memory import optimizer_state
from kmp.memory import quantized_state
from kmp.memory.block_codes import BLOCK

OPTIMIZERS = {
    "Adam": lambda: keras.optimizers.Adam(1e-2),
    "AdamW": lambda: keras.optimizers.AdamW(1e-2, weight_decay=0.1),
    "SGD": lambda: keras.optimizers.SGD(1e-1, momentum=0.9),
    "Lion": lambda: keras.optimizers.Lion(1e-3),
    # AMSGrad's running maximum of the second moment: unsigned codes.
    "Adam_amsgrad": lambda: keras.optimizers.Adam(1e-2, amsgrad=True),
    "SGD_nesterov": lambda: keras.optimizers.SGD(
        1e-1, momentum=0.9, nesterov=True
    ),
}


def _numpy(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 16)).astype("float32")
    y = np.tanh(x @ rng.normal(size=(16, 4))).astype("float32")
    return x, y


def _model():
    # The hidden kernel (512 parameters) is two blocks; the rest smaller.
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(4),
        ]
    )


def _trained(optimizer, steps=4):
    model = _model()
    model.compile(optimizer, "mse", jit_compile=JIT_COMPILE[0])
    x, y = _data()  # 8 batches an epoch
    epochs, steps = (steps // 8, None) if steps % 8 == 0 else (1, steps)
    model.fit(
        x, y, batch_size=32, epochs=epochs, steps_per_epoch=steps, verbose=0
    )
    return model


def _state_dtypes(optimizer):
    """{shape: dtype} of the optimizer's variables."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return {tuple(v.shape): str(v.dtype) for v in inner.variables}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_slots_are_8_bit_and_the_run_follows_float32_state(name):
    reference = _trained(OPTIMIZERS[name]())
    optimizer = kmp.wrap(OPTIMIZERS[name](), state_dtype="int8")
    model = _trained(optimizer)
    assert type(optimizer).__name__ == "LowPrecision" + name.split("_")[0]
    dtypes = _state_dtypes(optimizer)
    assert dtypes[(16, 32)] == "int8" and dtypes[(2,)] == "float32"
    # Under a block: float32 slots.
    assert dtypes[(32,)] == dtypes[(32, 4)] == "float32"
    # Four steps: the hidden kernel moved as float32 state moved it, to
    # the codes' rounding. Lion's step is a sign: where its moment is
    # near 0 the rounding may flip it, a full step apart (a few of 512
    # entries: 6 % of the norm on TensorFlow, 4 % on torch).
    bound = 0.1 if name == "Lion" else 0.03
    start = _model().get_weights()[0]
    moved = np.linalg.norm(reference.get_weights()[0] - start)
    apart = np.linalg.norm(model.get_weights()[0] - reference.get_weights()[0])
    assert moved > 0.01 and apart < bound * moved, (moved, apart)


@pytest.mark.skipif(
    backend.name() != "torch",
    reason="only torch's optimizers update many variables in one call",
)
def test_on_torch_the_grouped_update_is_the_per_variable_one(monkeypatch):
    def run(in_groups):
        monkeypatch.setattr(backend, "updates_in_groups", lambda: in_groups)
        optimizer = keras.optimizers.AdamW(1e-2, weight_decay=0.1)
        model = _trained(kmp.wrap(optimizer, state_dtype="int8"))
        return [_numpy(v) for v in [*model.weights, *optimizer.variables]]

    # Keras's multi-tensor kernels and its per-variable update_step: the
    # same float32 arithmetic in another order, the same draws.
    together, one_by_one = run(True), run(False)
    for a, b in zip(together, one_by_one):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(
    backend.name() != "torch",
    reason="only torch's grouped update quantizes many slots at once",
)
def test_on_torch_slots_are_requantized_together_with_the_same_bits(
    monkeypatch,
):
    dequantized = quantized_state.dequantized

    def run(together):
        def scope(optimizer, weights, after=None, pass_elements=None):
            passes = pass_elements if together else None
            return dequantized(optimizer, weights, after, passes)

        monkeypatch.setattr(quantized_state, "dequantized", scope)
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((16,)), *map(keras.layers.Dense, (32, 32, 4))]
        )
        optimizer = kmp.wrap(keras.optimizers.Adam(1e-2), state_dtype="int8")
        model.compile(optimizer, "mse")
        x, y = _data()
        model.fit(x, y, batch_size=32, epochs=1, steps_per_epoch=3, verbose=0)
        codes = [v for v in optimizer.variables if v.path.endswith("codes")]
        assert len(codes) == 4  # two kernels' m and v: two per pass
        return [_numpy(v) for v in [*model.weights, *optimizer.variables]]

    for a, b in zip(run(True), run(False)):
        np.testing.assert_array_equal(a, b)


def test_adamw_s_loss_follows_float32_state_within_1_percent():
    def loss(state_dtype):
        optimizer = keras.optimizers.AdamW(3e-3, weight_decay=0.01)
        if state_dtype:
            optimizer = kmp.wrap(optimizer, state_dtype=state_dtype)
        model = _trained(optimizer, steps=48)
        return model.evaluate(*_data(), verbose=0)

    float32, int8 = loss(None), loss("int8")
    assert abs(int8 / float32 - 1) < 0.01, (float32, int8)


def _second_moment_after_a_change():
    """Adam's second moment of a 64x64 weight after 100 steps in which
    its gradients grow 1.2x: from v0 (a code's value at 0.25 of the
    block's scale, which each block's first entry, whose gradient stays
    2, holds at 4) float32 moves it to v0 (1.44 - 0.44 * 0.999**100),
    by 0.00044 v0 a step at first: a sixteenth of the unsigned map's
    gap there (0.9 / 128 of the scale)."""
    table = block_codes.dynamic_map(False)
    v0 = 4 * table[np.argmin(np.abs(table - 0.25))]
    first = np.zeros((64, 64), bool)
    first.flat[::BLOCK] = True
    gradient = np.where(first, 2.0, 1.2 * np.sqrt(v0)).astype("float32")
    weights = keras.Variable(np.ones((64, 64)), dtype="float32")
    optimizer = kmp.wrap(keras.optimizers.Adam(1e-6), state_dtype="int8")
    optimizer.build([weights])
    optimizer.iterations.assign(100_000)  # bias corrections ~1
    momentum, velocity = quantized_state.slots_of(optimizer, [weights])
    for slot, value in (
        (momentum, gradient / 1.2 * np.where(first, 1.2, 1.0)),
        (velocity, np.where(first, 4.0, v0)),
    ):
        codes, scales = block_codes.quantize(
            keras.ops.convert_to_tensor(value.astype("float32")), slot.signed
        )
        slot.codes.assign(codes)
        slot.scales.assign(scales)
    for _ in range(100):
        optimizer.apply([keras.ops.convert_to_tensor(gradient)], [weights])
    moved = _numpy(
        block_codes.dequantize(velocity.codes, velocity.scales, False)
    )
    return moved[~first], v0


def test_the_second_moment_follows_float32_rounded_stochastically(
    monkeypatch,
):
    moved, v0 = _second_moment_after_a_change()
    expected = v0 * (1.44 - 0.44 * 0.999**100)
    assert abs(moved.mean() / expected - 1) < 2e-3, (moved.mean(), expected)
    # Rounded to nearest, every step is under half a gap: it never moves.
    # (Both `quantize` and the torch grouped update's `quantize_many`
    # round in `_grid_codes`.)
    grid_codes = block_codes._grid_codes
    monkeypatch.setattr(
        block_codes,
        "_grid_codes",
        lambda grid, signed, noise: grid_codes(grid, signed, None),
    )
    moved, v0 = _second_moment_after_a_change()
    np.testing.assert_allclose(moved, v0, rtol=1e-6)


def _bytes(state_dtype, master_weights):
    kmp.enable("mixed_bfloat16", master_weights=master_weights)
    keras.utils.set_random_seed(0)
    # Tensors of many blocks each, as a model's are (a bias of 512: 2).
    model = keras.Sequential(
        [
            keras.Input((256,)),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(256),
        ]
    )
    optimizer = keras.optimizers.AdamW(1e-3)
    if state_dtype:
        optimizer = kmp.wrap(optimizer, state_dtype=state_dtype)
    model.compile(optimizer, "mse")
    optimizer.build(model.trainable_variables)
    counted = backend.state_bytes(model)
    return counted["weights"] + counted["optimizer_state"]


def test_adamw_weights_and_state_take_half_or_a_third_of_float32_s():
    float32 = _bytes(None, "float32")
    # 12 bytes a parameter, exactly, and the step and the rate (8 or,
    # with TensorFlow's int64 step, 12 bytes).
    parameters = 256 * 512 + 512 + 512 * 256 + 256
    assert float32 - 12 * parameters in (8, 12)
    # 4 + 1 + 1 (+ 2 x 4 / 256 of scales): 0.503x; 2 + 1 + 1: 0.336x.
    masters32 = _bytes("int8", "float32") / float32
    masters16 = _bytes("int8", "bfloat16") / float32
    assert masters32 <= 0.51 and masters16 <= 0.345, (masters32, masters16)


def _same_state_and_resumes(model, loaded):
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(_numpy(a), _numpy(b))
    before = [_numpy(w) for w in loaded.weights]
    x, y = _data()
    loaded.fit(x, y, batch_size=32, epochs=1, steps_per_epoch=2, verbose=0)
    after = [_numpy(w) for w in loaded.weights]
    assert all(np.all(np.isfinite(w)) for w in after)
    assert any(np.any(a != b) for a, b in zip(before, after))


def test_under_kmp_s_scaler_the_file_keeps_the_mode_and_resumes(tmp_path):
    kmp.enable("mixed_float16")
    model = _trained(kmp.wrap(keras.optimizers.AdamW(1e-2), state_dtype="int8"))
    assert isinstance(model.optimizer, kmp.LossScaleOptimizer)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = kmp.load_model(path)
    inner = loaded.optimizer.inner_optimizer
    assert type(inner).__name__ == "LowPrecisionAdamW"
    assert optimizer_state.state_dtype_of(inner) == "int8"
    assert _state_dtypes(loaded.optimizer)[(16, 32)] == "int8"
    _same_state_and_resumes(model, loaded)
    assert int(inner.iterations) == 6


def test_bfloat16_masters_keep_int8_state_in_the_file_and_the_backup(
    tmp_path,
):
    kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    model = _trained(kmp.wrap(keras.optimizers.Adam(1e-2), state_dtype="int8"))
    assert optimizer_state.rounding_of(model.optimizer) == "stochastic"
    assert {str(w.dtype) for w in model.weights} == {"bfloat16"}
    assert _state_dtypes(model.optimizer)[(16, 32)] == "int8"
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = kmp.load_model(path)
    assert {str(w.dtype) for w in loaded.weights} == {"bfloat16"}
    _same_state_and_resumes(model, loaded)
    # Keras's backup (what `kmp train` resumes from) holds the codes and
    # scales too: a fresh model restored from it has the same state.
    backup = keras.callbacks.BackupAndRestore(
        str(tmp_path / "backup"), delete_checkpoint=False
    )
    x, y = _data()
    runs = []
    for _ in range(2):  # the second resumes after the first's epoch
        run = _model()
        run.compile(
            kmp.wrap(keras.optimizers.Adam(1e-2), state_dtype="int8"),
            "mse",
            jit_compile=JIT_COMPILE[0],
        )
        run.fit(x, y, batch_size=32, epochs=1, callbacks=[backup], verbose=0)
        runs.append(run)
    assert int(runs[1].optimizer.iterations) == 8
    for a, b in zip(runs[0].optimizer.variables, runs[1].optimizer.variables):
        np.testing.assert_array_equal(_numpy(a), _numpy(b))


@pytest.mark.slow
def test_a_fresh_process_loads_the_file_and_its_codes(tmp_path):
    path = str(tmp_path / "m.keras")
    model = _trained(kmp.wrap(keras.optimizers.Adam(1e-2), state_dtype="int8"))
    model.save(path)
    codes = [v for v in model.optimizer.variables if v.dtype == "int8"]
    code = (
        "import sys, keras, numpy, kmp\n"
        "m = kmp.load_model(sys.argv[1])\n"
        "codes = [v for v in m.optimizer.variables if v.dtype == 'int8']\n"
        "print(type(m.optimizer).__name__, len(codes), "
        "numpy.abs(keras.ops.convert_to_numpy(codes[0]).astype(int)).sum())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, path],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-500:]
    total = np.abs(keras.ops.convert_to_numpy(codes[0]).astype(int)).sum()
    assert done.stdout.split()[-3:] == ["LowPrecisionAdam", "2", str(total)]


_STEP_MEMORY = """
import json, keras, numpy as np, kmp
from kmp import backend
x, y = np.zeros((8, 256), "float32"), np.zeros((8,), "int32")
out = {}
for states in ("float32", "int8"):
    model = keras.Sequential([keras.Input((256,))] + [
        keras.layers.Dense(256, activation="relu") for _ in range(6)])
    model.compile(kmp.wrap(keras.optimizers.AdamW(), state_dtype=states),
                  "sparse_categorical_crossentropy")
    memory = backend.train_step_memory(model, x, y, 8)
    out[states] = [memory["temp"], memory["footprint"]]
print("RESULT " + json.dumps([out, model.count_params()]))
"""


@pytest.mark.skipif(
    backend.name() != "jax", reason="XLA's analysis before a step: JAX's"
)
def test_the_compiled_step_dequantizes_once_the_gradient_exists():
    # Nothing but the slot feeds a slot's dequantization: unordered, XLA
    # hoists every one of them to the step's start, and their float32
    # moments (8 bytes a parameter) outlive the backward pass, so that
    # the step held more than with float32 state (7.6 MB against 5.4 MB
    # here). A GPU keeps the barrier `kmp.backend.ordered_after` puts
    # there through scheduling; a CPU drops it before, unless told.
    flags = "--xla_disable_hlo_passes=cse_barrier_expander"
    done = subprocess.run(
        [sys.executable, "-c", _STEP_MEMORY],
        capture_output=True,
        text=True,
        env=dict(os.environ, XLA_FLAGS=flags),
        timeout=200,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    memory, params = script_result(done.stdout)
    assert memory["int8"][1] < memory["float32"][1]  # 4.8 MB: 0.89x
    # One variable's update at a time, not every slot's moments at once.
    assert memory["int8"][0] - memory["float32"][0] < 8 * params


def test_slots_made_under_a_deferred_start_train():
    # kmp's JAX start (`initialized_together`, used by the examples) runs
    # the slots' initializers later, in one program: they must return
    # the first codes and scales, not the variables made from them.
    kmp.enable("mixed_bfloat16")
    model = keras.Sequential(
        [keras.Input((300,)), keras.layers.Dense(300), keras.layers.Dense(4)]
    )
    optimizer = kmp.wrap(keras.optimizers.AdamW(1e-3), state_dtype="int8")
    model.compile(optimizer=optimizer, loss="mse", jit_compile=JIT_COMPILE[0])
    with backend.initialized_together():
        model.optimizer.build(model.trainable_variables)
    x = np.ones((16, 300), "float32")
    history = model.fit(x, x[:, :4], epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def test_int8_is_refused_where_it_is_not_offered():
    with pytest.raises(kmp.InputError, match="not offered for RMSprop"):
        kmp.wrap(keras.optimizers.RMSprop(), state_dtype="int8")
    with pytest.raises(kmp.InputError, match="'int4' is not supported"):
        kmp.wrap(keras.optimizers.Adam(), state_dtype="int4")
