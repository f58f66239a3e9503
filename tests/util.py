"""Helpers shared by the tests."""

import concurrent.futures
import functools
import importlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import zipfile

import keras
import numpy as np
import pytest
import tomllib
from hypothesis import strategies as st
from keras import ops

from kmp import backend

tf_only = pytest.mark.skipif(
    backend.name() != "tensorflow", reason="TensorFlow backend only"
)
jax_only = pytest.mark.skipif(
    backend.name() != "jax", reason="JAX backend only"
)
torch_only = pytest.mark.skipif(
    backend.name() != "torch", reason="PyTorch backend only"
)
not_tf = pytest.mark.skipif(
    backend.name() == "tensorflow", reason="backends other than TensorFlow"
)


ROOT = pathlib.Path(__file__).resolve().parents[1]


def keras_tested_with() -> str:
    """The Keras version the `test` extra pins (pyproject.toml)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    pins = [p.replace(" ", "") for p in extras["test"]]
    return [p for p in pins if p.startswith("keras==")][0].split("==")[1]


def keras_own_tests(name):
    """Keras's own test module `name` (e.g.
    "keras.src.callbacks.backup_and_restore_test"), for a file that runs
    it against kmp's class; call it at the file's import. The pinned
    Keras's wheel ships its tests: their absence there is an error (a
    broken install or a renamed module), to be seen, not skipped. With
    another Keras the calling file (that file only) is skipped, saying
    so."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        if keras.__version__ == keras_tested_with():
            raise
    pytest.skip(
        f"Keras {keras.__version__} ships no {name}; the suite runs "
        f"against the pinned Keras {keras_tested_with()}",
        allow_module_level=True,
    )


# The `jit_compile` values fit tests run with: XLA and TensorFlow's graph
# on TensorFlow. On JAX, `jit_compile=False` dispatches op by op, which no
# one trains with, and Keras's scaler then compiles its `lax.cond` on
# every step (0.2 s): JAX's fit tests jit. On torch, Keras's default is
# eager and `jit_compile=True` is torch.compile, whose first step costs
# 30-70 s of compiling on a 2-core CPU: there the fit tests run eagerly,
# and test_torch_compile_recompiles_the_stock_scaler_s_cond_not_kmp_s
# (slow) covers torch.compile.
JIT_COMPILE = {"jax": [True], "torch": [False]}.get(
    backend.name(), [True, False]
)


def classification_data(n=256, features=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int32")
    return x, y


class CentralizedSGD(keras.optimizers.SGD):
    """keras-io's gradient centralization as Keras 3 lets one write it: an
    override of `apply_gradients`. Under SGD a kernel's column means then
    never move: each update has a mean of 0 over the kernel's inputs."""

    def apply_gradients(self, grads_and_vars):
        grads, variables = zip(*grads_and_vars)
        grads = [
            g - ops.mean(g, axis=0, keepdims=True) if len(g.shape) > 1 else g
            for g in grads
        ]
        return super().apply_gradients(zip(grads, variables))


def mlp(features=8, units=16, seed=0):
    """A small classifier whose output softmax is float32."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(2),
            keras.layers.Activation("softmax", dtype="float32"),
        ]
    )


# --- Tests that need processes of their own (devices, TF_CONFIG and the
# backend are fixed when a framework starts). ---

HERE = os.path.dirname(os.path.abspath(__file__))


def as_if_scaled(optimizer):
    """For a test that hands `optimizer.apply` gradients made by hand that
    stand for gradients of the scaled loss: calls `scale_loss`, as a loop
    that scales its loss does, so that kmp divides the next apply's
    gradients by the scale (`kmp.scaling.scaled_losses`). Harmless on
    Keras's own scaler."""
    optimizer.scale_loss(1.0)


def script_result(stdout):
    """The JSON of a helper script's last `RESULT {...}` line."""
    line = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[-1][len("RESULT ") :])


def run_script(script, *args, backend="tensorflow", timeout=300):
    """Runs `tests/<script> ARGS` under `backend`; returns its result."""
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, KERAS_BACKEND=backend),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return script_result(result.stdout)


# Keras's NNX mode: JAX, with Flax installed (the `test` extra installs
# it; a development environment may lack it).
nnx_only = pytest.mark.skipif(
    backend.name() != "jax" or importlib.util.find_spec("flax") is None,
    reason="Keras's NNX mode: the JAX backend with flax installed",
)


_NNX_RUNS = {}


def run_under_nnx(name, tmp_path_factory):
    """`tests/nnx_runs.py NAME`'s result: kmp under Keras's NNX mode, in
    a process of its own (Keras reads `KERAS_NNX_ENABLED` when imported),
    one for every case, once per pytest run (`once_per_session`)."""

    def run():
        if "all" not in _NNX_RUNS:  # one process (-n 0): once in it too
            result = run_script("nnx_runs.py", "all", backend="jax")
            assert result.pop("nnx")
            _NNX_RUNS["all"] = result
        return _NNX_RUNS["all"]

    result = once_per_session(tmp_path_factory, "nnx_runs", run)[name]
    assert "raised" not in result, result["raised"]
    return result


def once_per_session(tmp_path_factory, name, compute):
    """`compute()`'s result (JSON), computed once for the whole pytest run.

    A module-scoped fixture runs again in each pytest process (`-n auto`) and
    again whenever work stealing interleaves another module's tests (the
    MirroredStrategy scenarios' process ran three times in one TensorFlow
    run): the processes share the first result through a file, under a
    lock, in the run's own base directory (one run's, never another's).
    """
    import fcntl

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return compute()  # one process: a session fixture's scope suffices
    # Under xdist each process's base is <run>/popen-gwN: <run> is shared.
    path = tmp_path_factory.getbasetemp().parent / f"{name}.json"
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return json.loads(path.read_text())
        result = compute()
        path.write_text(json.dumps(result))
        return result


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_processes(argvs, envs, timeout, backend="tensorflow", check=True):
    """Runs Python processes side by side (TensorFlow backend unless
    told); returns their stdouts, each process having exited with 0
    (`check=False`: `(returncode, stdout, stderr)` of each, however it
    exited). A process still running after `timeout` s fails either way."""
    procs = [
        subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, KERAS_BACKEND=backend, **env),
        )
        for argv, env in zip(argvs, envs)
    ]
    # Drain every process's pipes at once: drained one after another, a
    # process blocked on a full pipe would stall the collective the one
    # being drained waits in.
    with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:
        futures = [pool.submit(p.communicate, timeout=timeout) for p in procs]
        concurrent.futures.wait(futures)
    if any(f.exception() for f in futures):  # a timeout: say what each said
        for p in procs:
            p.kill()
    outputs = [
        p.communicate() if f.exception() else f.result()
        for p, f in zip(procs, futures)
    ]
    said = "\n".join(f"[{i}] {e[-1500:]}" for i, (_, e) in enumerate(outputs))
    for i, (p, f) in enumerate(zip(procs, futures)):
        # A hang fails even unchecked: every caller expects an end.
        assert not f.exception(), f"process {i} hung past {timeout} s:\n{said}"
        if check:
            assert p.returncode == 0, (
                f"process {i} failed (exit {p.returncode}):\n{said}"
            )
    if not check:
        return [(p.returncode, *out) for p, out in zip(procs, outputs)]
    return [out for out, _ in outputs]


def fails_in_one_line(argv, phrase, capsys):
    """Runs `kmp ARGV` in this process: it must exit non-zero with `phrase`
    on stderr and no traceback (tests/app/cli_test.py says why this is the
    shell's view). Returns the exit status a shell sees."""
    import kmp_cli

    with pytest.raises(SystemExit) as exited:
        kmp_cli.main(argv)
    code, stderr = exited.value.code, capsys.readouterr().err
    if isinstance(code, str):  # Python prints it and exits with 1
        code, stderr = 1, stderr + code + "\n"
    assert code != 0
    assert phrase in stderr
    assert "Traceback" not in stderr
    return code


# Loss-scale rules for property tests (hypothesis strategies), with
# min_scale 1 and max_scale 2**8.
SCALE_RULES = {
    "growth_steps": st.integers(1, 3),
    "hysteresis": st.integers(1, 3),
    "growth": st.sampled_from([1.5, 2.0, 4.0]),
    "backoff": st.sampled_from([0.25, 0.5, 0.9]),
    "initial_exp": st.integers(0, 8),
}


@functools.cache
def docstring_pseudo_code():
    """The loss-scale rule as `kmp.LossScaleOptimizer`'s docstring writes
    it: the first code block there, compiled (it is valid Python)."""
    import textwrap

    import kmp

    doc = kmp.LossScaleOptimizer.__doc__
    block = doc.split("```\n", 2)[1]  # the block before the Args
    return compile(textwrap.dedent(block), "<docstring>", "exec")


def reference_scale_rule(
    kinds, initial, growth_steps, growth, backoff, lo, hi, hyst, dynamic=True
):
    """Runs the docstring's pseudo-code (`docstring_pseudo_code`) over the
    steps `kinds` ("finite" or not): `(scale, step_counter,
    overflow_streak, skipped_steps)` after them, the scale computed in
    float32 as the optimizer's variable is."""

    class Inner:
        def apply(self, grads):
            pass

    code = docstring_pseudo_code()
    state = {
        "scale": np.float32(initial),
        "step_counter": 0,
        "overflow_streak": 0,
        "skipped_steps": 0,
    }
    for kind in kinds:
        grads = [np.float32(1.0 if kind == "finite" else np.inf)]
        env = {
            **state,
            "grads": grads,
            "isfinite": np.isfinite,
            "inner_optimizer": Inner(),
            "dynamic": dynamic,
            "hysteresis": hyst,
            "backoff_factor": np.float32(backoff),
            "growth_factor": np.float32(growth),
            "min_scale": np.float32(lo),
            "max_scale": np.float32(hi),
            "dynamic_growth_steps": growth_steps,
        }
        exec(code, env)
        state = {name: env[name] for name in state}
    return (
        float(state["scale"]),
        state["step_counter"],
        state["overflow_streak"],
        state["skipped_steps"],
    )


def overflow_model():
    """A model whose Dense `big` overflows float16 (outputs near 7.7e4 for
    inputs in [1.7, 2.0]), rescaled back into range by `shrink`."""
    import kmp

    with kmp.policy_scope("mixed_float16"):
        inputs = keras.Input((4,))
        x = keras.layers.Dense(
            8, kernel_initializer=keras.initializers.Constant(1e4), name="big"
        )(inputs)
        x = keras.layers.Rescaling(1e-4, name="shrink")(x)
        outputs = keras.layers.Dense(1, name="head")(x)
        model = kmp.pin_float32(keras.Model(inputs, outputs))
    model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
    return model


def probability_model(policy):
    """Dense logits [0, -30] for any input, then a softmax output layer
    (crossentropy of class 1: 30 exactly, 16.118 from a float16 softmax
    clipped to 1e-7)."""
    import kmp

    with kmp.policy_scope(policy):
        model = keras.Sequential(
            [
                keras.Input((1,)),
                keras.layers.Dense(2),
                keras.layers.Activation("softmax"),
            ]
        )
    model.layers[0].set_weights(
        [np.zeros((1, 2), "float32"), np.array([0.0, -30.0], "float32")]
    )
    return model


class Interrupted(Exception):
    """What `interrupt_runs` raises, as a kill would."""


def _raise_interrupted():
    raise Interrupted


def interrupt_runs(patch, after_epochs, interrupt=_raise_interrupted):
    """Makes every example run (`kmp.app.run.Run`) call `interrupt()`
    (by default: raise `Interrupted`) at the end of epoch `after_epochs`,
    after its backup; `patch` is a `monkeypatch.context()`."""
    from kmp.app.run import Run

    start = Run.start

    def stop(epoch, logs):
        if epoch == after_epochs - 1:
            interrupt()

    def interrupted(self, *args):
        steps = start(self, *args)
        self.callbacks.append(keras.callbacks.LambdaCallback(on_epoch_end=stop))
        return steps

    patch.setattr(Run, "start", interrupted)


def small_imdb_config(**changes):
    """The IMDB example at test size: a 1-block encoder of width 16 on 16
    tokens of a 64-word vocabulary, synthetic data, 2 steps of batch 8,
    quiet; `changes` on top."""
    from kmp.examples import imdb

    settings = dict(
        data="synthetic",
        synthetic_size=32,
        epochs=1,
        steps=2,
        batch_size=8,
        d_model=16,
        heads=2,
        layers=1,
        sequence_length=16,
        vocabulary_size=64,
        verbose=0,
    )
    return imdb.Config(**{**settings, **changes})


def small_gpt2_backbone(dropout=0.1):
    """KerasHub's GPT-2 from a small config (no preset): 2 layers of
    width 32, 2 heads, 64 tokens, sequences up to 16; KerasHub's dropout
    unless told (0: Keras's fused attention path). keras-hub is pinned
    in the test extra: its absence is an error, not a skip."""
    import keras_hub

    return keras_hub.models.GPT2Backbone(
        vocabulary_size=64,
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=16,
        dropout=dropout,
    )


def padded_tokens(side="right"):
    """Two sequences of 16 tokens, the second padded after 10 (or, on
    the left, before 6)."""
    ids = np.random.default_rng(0).integers(1, 64, (2, 16)).astype("int32")
    mask = np.ones((2, 16), bool)
    if side == "right":
        mask[1, 10:] = False
    else:
        mask[1, :6] = False
    return {"token_ids": ids, "padding_mask": mask}


def attention_calls(monkeypatch, record):
    """A list that gets `record(kwargs)` for each
    `jax.nn.dot_product_attention` call (what Keras's JAX attention and
    `kmp.backend.causal_attention` call), in order."""
    import jax

    calls = []
    stock = jax.nn.dot_product_attention

    def spy(*args, **kwargs):
        calls.append(record(kwargs))
        return stock(*args, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
    return calls


def is_causal_calls(monkeypatch):
    """Each attention call's `is_causal` and whether it got a mask (a
    test's fixture returns the list)."""
    return attention_calls(
        monkeypatch,
        lambda kwargs: (
            kwargs.get("is_causal"),
            kwargs.get("mask") is not None,
        ),
    )


def window_calls(monkeypatch):
    """Each attention call's `local_window_size` (None where not given)."""
    return attention_calls(
        monkeypatch, lambda kwargs: kwargs.get("local_window_size")
    )


def random_weights(model, seed=1):
    """Gives every trainable variable of `model` normal values (standard
    deviation 0.2), not its initializer's: KerasHub's biases start at
    zero, where a bias added wrongly would not show."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for variable in model.trainable_variables:
        variable.assign(rng.normal(0, 0.2, variable.shape))
    return model


def loss_and_gradients(model, x):
    """The sum of squares of `model(x)` in float32 (of every output, for
    a model with several) and its gradients with respect to the
    trainable variables, as NumPy float32 arrays, taken in one jitted
    step (`kmp.backend.taped_gradients`, on every backend): what a layer
    change must leave as it was. `x` may be a dict of inputs."""
    import keras
    from keras import ops

    from kmp import backend

    def loss_fn(values, args, tap):
        mapping = list(zip(model.trainable_variables, values))
        with keras.StatelessScope(state_mapping=mapping):
            out = model(args[0])
        return sum(
            ops.sum(ops.square(ops.cast(o, "float32")))
            for o in keras.tree.flatten(out)
        )

    run = backend.taped_gradients(loss_fn, jit_compile=True)
    values = [v.value for v in model.trainable_variables]
    x = keras.tree.map_structure(ops.convert_to_tensor, x)
    loss, _, _, grads, _ = run(values, x)
    return [
        ops.convert_to_numpy(ops.cast(v, "float32")) for v in [loss, *grads]
    ]


def fit_small_gpt2(model):
    """Compiles a `GPT2CausalLM` on `small_gpt2_backbone` (Adam under
    `kmp.wrap`) and fits it 2 epochs on 8 random sequences of 16 tokens;
    returns the epochs' losses, checked finite and falling."""
    import keras
    import numpy as np

    import kmp

    model.compile(
        optimizer=kmp.wrap(keras.optimizers.Adam(1e-3)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 64, size=(8, 16)).astype("int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids, dtype=bool)}
    history = keras.Model.fit(
        model, x, np.roll(ids, -1, axis=1), batch_size=4, epochs=2, verbose=0
    )
    losses = history.history["loss"]
    assert np.isfinite(losses).all() and losses[-1] < losses[0], losses
    return losses


FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
TRANSFORMER = str(FIXTURES / "keras_io_transformer.py")


def saved_keras_io_transformer(path):
    """keras-io's transformer classifier saved to `path` by a process
    that then forgets its classes, as a shell's next command would not
    know them: the module is gone and Keras's registry holds none of
    its classes (use it with conftest's `registry` fixture, which puts
    both back after the test)."""
    import importlib.util
    import sys

    import keras

    import kmp

    spec = importlib.util.spec_from_file_location(
        "keras_io_transformer", TRANSFORMER
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with kmp.policy_scope("mixed_float16"):
        model = module.build_model()
    model.compile(optimizer=kmp.wrap("adam"), loss="mse")
    model.save(path)
    registry = keras.saving.get_custom_objects()
    for name in [n for n in registry if n.startswith("keras_io>")]:
        del registry[name]
    sys.modules.pop("keras_io_transformer", None)


def saved_under_keras_s_scaler(path, steps=2):
    """An MLP compiled with "adam" under mixed_float16 (Keras's compile
    wraps it in its own scaler), trained `steps` steps and saved to
    `path`; the global policy is back to float32 after, as in a new
    process. Returns the optimizer's iterations."""
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = mlp()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        x, y = classification_data(n=8 * steps)
        model.fit(x, y, batch_size=8, verbose=0)
        model.save(path)
    finally:
        keras.config.set_dtype_policy("float32")
    return int(model.optimizer.iterations)


class DropoutBlock(keras.layers.Layer):
    """Dense, dropout, batch normalization, Dense: state written in the
    call (the dropout's seed, the moving statistics)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.first = keras.layers.Dense(16, activation="relu")
        self.dropout = keras.layers.Dropout(0.5, seed=1)
        self.norm = keras.layers.BatchNormalization(momentum=0.5)
        self.second = keras.layers.Dense(1)

    def call(self, inputs, training=None):
        x = self.dropout(self.first(inputs), training=training)
        return self.second(self.norm(x, training=training))


class DtypeRecordingDense(keras.layers.Dense):
    """Records `(inputs dtype, kernel dtype)` at every call, the
    recomputation of a rematerialized step included."""

    seen = []

    def call(self, inputs):
        self.seen.append(
            (
                keras.backend.standardize_dtype(inputs.dtype),
                keras.backend.standardize_dtype(self.kernel.dtype),
            )
        )
        return super().call(inputs)


def torch_calls(run):
    """Runs `run()` on torch, returning every aten call it dispatched, in
    order: `(func, args, result)` (the tests that count kernels, host
    reads or float8 GEMMs filter these)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            calls.append((func, args, out))
            return out

    with Record():
        run()
    return calls


def damage(path, member="model.weights.h5"):
    """Flips one byte in the middle of `member`'s data in the `.keras`
    archive at `path`: its zip checksum no longer matches."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    data = bytearray(pathlib.Path(path).read_bytes())
    # The local header: 30 bytes, then the name and the extra field.
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + info.compress_size // 2] ^= 0xFF
    pathlib.Path(path).write_bytes(bytes(data))
