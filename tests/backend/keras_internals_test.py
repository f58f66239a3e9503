"""kmp.backend.keras_internals, and every private name of Keras that kmp
reaches (BUILD_NOTES.md, "What kmp reaches in Keras's private code"),
checked on the Keras this runs with.

`REACHES` lists them: each name, the Keras object that has it, the
parameters kmp calls or overrides it with, and the kmp feature that
breaks without it. A Keras that renames one fails here, with a message
that names the feature and its module, before a step fails somewhere
inside it. `test_every_reach_is_listed` reads kmp's source and fails on a
`keras.src` import or a private name of a Keras object that the list
lacks, and on an entry that kmp no longer uses.
"""

import ast
import atexit
import collections
import inspect
import pathlib
import re
import shutil
import tempfile

import keras
import numpy as np
import pytest

import kmp
from kmp import backend

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTES = 'BUILD_NOTES.md, "What kmp reaches in Keras\'s private code"'

Reach = collections.namedtuple(
    "Reach", "owner name parameters feature backends", defaults=(None,)
)

_WALKS = (
    "every walk of a model's layers: kmp.pin_float32, kmp.float8, "
    "kmp.rematerialize, kmp.audit, kmp.diagnose, kmp.load_model "
    "(kmp/model_layers.py and the others that call it)"
)
_TOKEN_IDS = "kmp.pin_float32's token-id paths (kmp/islands/token_ids.py)"
_REMAT = "kmp.rematerialize (kmp/memory/remat.py)"
_STATE = (
    "kmp.wrap(..., state_dtype=, rounding=): 16-bit optimizer state "
    "(kmp/memory/optimizer_state.py)"
)
_SCALER = "kmp.LossScaleOptimizer (kmp/scaling/loss_scale_optimizer.py)"
_INITIALIZATION = (
    "JAX's first values in one program, backend.initialized_together "
    "(kmp/backend/initialization.py)"
)
_BACKUP = (
    "kmp.callbacks.BackupAndRestore's and ModelCheckpoint's whole saves "
    "(kmp/callbacks/checkpoints.py)"
)
_STATELESS = "keras.src.backend.common.stateless_scope"
_VARIABLES = "keras.src.backend.common.variables"

# The owner is a key of OWNERS, or the module a name is imported from.
REACHES = [
    # Layers and models.
    Reach("layer", "_flatten_layers", ("include_self", "recursive"), _WALKS),
    Reach("layer", "_remat_mode", None, _REMAT),
    Reach("layer", "rematerialized_call", ("layer_call",), _REMAT),
    Reach(
        "layer",
        "quantized_call",
        (),
        "kmp.diagnose's float8 operands (kmp/fp8/operands.py) and its "
        "taps of quantized layers (kmp/doctor/_taps.py)",
    ),
    Reach(
        "layer",
        "_dtype_policy",
        None,
        "kmp.diagnose's float32 pass (kmp/doctor/_taps.py); a made "
        "layer's policy in its host's map (kmp/layer_policies.py)",
    ),
    Reach(
        "layer",
        "_tracker",
        None,
        "kmp.float8 of a built layer: its amax histories "
        "(kmp/fp8/float8_layers.py)",
    ),
    Reach(
        "layer",
        "_inbound_nodes",
        None,
        "kmp.float8's choice of a model's head (kmp/fp8/convert.py); "
        "kmp.pin_float32's outputs another layer takes and Rescaling "
        "layers of raw values (kmp/model_layers.py, "
        "kmp/islands/feature_normalization.py)",
    ),
    Reach("layer", "_outbound_nodes", None, _TOKEN_IDS),
    Reach("layer", "_convert_input_args", None, _TOKEN_IDS),
    Reach(
        "layer",
        "_open_name_scope",
        (),
        "kmp's note on a 16-bit/float32 error in a user's layer "
        "(kmp/backend/policy_hooks.py)",
    ),
    Reach(
        "layer",
        "_build_shapes_dict",
        None,
        "kmp.audit's output dtypes of a subclassed model "
        "(kmp/auditing/model_checks.py)",
    ),
    Reach(
        "dropout",
        "_seed_generators",
        None,
        "kmp.diagnose's random layers (kmp/doctor/_taps.py)",
    ),
    Reach(
        "keras_tensor",
        "_keras_history",
        None,
        "kmp.float8's head, kmp.audit's and kmp.pin_float32's graph walks "
        "(kmp/model_layers.py, kmp/fp8/convert.py)",
    ),
    Reach("model", "_nodes_by_depth", None, _TOKEN_IDS),
    Reach("sequential", "_functional", None, _TOKEN_IDS),
    Reach(
        "model",
        "_symbolic_build",
        ("iterator", "data_batch"),
        "backend.train_step_memory (kmp/backend/memory.py); kmp.distribute "
        "(kmp/distributed/fit.py)",
    ),
    Reach(
        "model",
        "_jit_compile",
        None,
        "kmp.diagnose's read of jit_compile (kmp/doctor/_inputs.py)",
    ),
    Reach(
        "model",
        "_make_function",
        ("step_function",),
        "kmp.distribute's multi-worker steps (kmp/distributed/fit.py)",
        ("tensorflow",),
    ),
    Reach(
        "model",
        "_maybe_symbolic_build",
        ("iterator", "data_batch"),
        "kmp.distribute's multi-worker build (kmp/distributed/fit.py)",
        ("tensorflow",),
    ),
    Reach(
        "model",
        "_distribute_strategy",
        None,
        "kmp.distribute (kmp/distributed/fit.py)",
        ("tensorflow",),
    ),
    Reach(
        "attention",
        "_build_attention",
        ("rank",),
        "kmp.pin_float32's float32 attention softmax "
        "(kmp/islands/float32_layers.py)",
    ),
    Reach(
        "attention",
        "_softmax",
        None,
        "kmp.pin_float32 and kmp.audit of attention softmaxes "
        "(kmp/islands/pin.py, kmp/auditing/model_checks.py)",
    ),
    Reach(
        "attention",
        "_compute_attention",
        (
            "query",
            "key",
            "value",
            "attention_mask",
            "training",
            "return_attention_scores",
            "use_causal_mask",
        ),
        "kmp.pin_float32's causal decoder attention on JAX "
        "(kmp/islands/causal_attention.py)",
    ),
    *(
        Reach(
            "attention",
            f"_{part}_dense",
            None,
            "kmp.float8 of attention projections (kmp/fp8/matmuls.py)",
        )
        for part in ("query", "key", "value", "output")
    ),
    Reach(
        "policy",
        "_parse_name",
        ("name",),
        "kmp's Float32Compute policy (kmp/layer_policies.py)",
    ),
    # Optimizers.
    Reach(
        "optimizer",
        "_backend_update_step",
        ("grads", "trainable_variables", "learning_rate"),
        _STATE,
    ),
    Reach(
        "optimizer",
        "_distributed_tf_update_step",
        ("distribution", "grads_and_vars", "learning_rate"),
        _STATE,
        ("tensorflow",),
    ),
    Reach("optimizer", "_var_key", ("variable",), _STATE),
    Reach("optimizer", "_get_variable_index", ("variable",), _STATE),
    Reach("optimizer", "_use_weight_decay", ("variable",), _STATE),
    Reach("optimizer", "_apply_weight_decay", ("variables",), _STATE),
    Reach("optimizer", "_trainable_variables", None, f"{_STATE}; {_SCALER}"),
    Reach("optimizer", "_variables", None, _SCALER),
    Reach("optimizer", "_clip_gradients", ("grads",), _SCALER),
    Reach(
        "optimizer",
        "_overwrite_variable_with_gradient",
        ("variable",),
        f"{_SCALER} with Keras's float8",
    ),
    Reach(
        "loss_scale_optimizer",
        "_stateful_handle_finite_grads",
        ("grads", "trainable_variables"),
        _SCALER,
    ),
    Reach(
        "loss_scale_optimizer", "_stateful_handle_non_finite_grads", (), _SCALER
    ),
    Reach(
        "loss_scale_optimizer",
        "_stateless_handle_finite_grads",
        ("optimizer_variables", "grads", "trainable_variables"),
        _SCALER,
    ),
    Reach(
        "loss_scale_optimizer",
        "_stateless_handle_non_finite_grads",
        ("optimizer_variables", "trainable_variables"),
        _SCALER,
    ),
    Reach(
        "loss_scale_optimizer",
        "_common_apply",
        ("grads", "trainable_variables"),
        _SCALER,
    ),
    # Variables.
    Reach(
        "variable",
        "_value",
        None,
        "the scaler's read of a variable a JAX step holds "
        "(kmp/backend/scaler_ops.py); torch's float32 working copies "
        "(kmp/backend/optimizer_updates.py)",
    ),
    Reach("variable", "_initializer", None, _INITIALIZATION),
    Reach("variable", "_shape", None, _INITIALIZATION),
    Reach("variable", "_dtype", None, _INITIALIZATION),
    # Callbacks and utilities.
    Reach(
        "backup",
        "_training_metadata_path",
        None,
        "the backup of several JAX processes (kmp/app/backup.py); " + _BACKUP,
    ),
    Reach(
        "backup",
        "_weights_path",
        None,
        "kmp.distribute's check that every worker sees the backup "
        "(kmp/distributed/fit.py); " + _BACKUP,
    ),
    Reach(
        "backup",
        "_save_model",
        (),
        "kmp.distribute: only the chief writes (kmp/distributed/fit.py); "
        + _BACKUP,
    ),
    Reach("backup", "_prev_weights_path", None, _BACKUP),
    Reach("backup", "_prev_training_metadata_path", None, _BACKUP),
    Reach("backup", "_current_epoch", None, _BACKUP),
    Reach("backup", "_last_batch_seen", None, _BACKUP),
    Reach(
        "checkpoint",
        "_save_model",
        ("epoch", "batch", "logs"),
        "kmp.distribute: only the chief writes (kmp/distributed/fit.py); "
        + _BACKUP,
    ),
    Reach("checkpoint", "_model", None, _BACKUP),
    Reach(
        "orbax",
        "_total_batches_seen",
        None,
        "kmp.callbacks.OrbaxCheckpoint's step numbers past a resumed run's "
        "skipped steps (kmp/callbacks/orbax_checkpoint.py)",
    ),
    Reach(
        "orbax",
        "_save_checkpoint",
        ("step", "logs"),
        "kmp.callbacks.OrbaxCheckpoint's epoch saves of a resumed fit "
        "numbered past the steps on disk (kmp/callbacks/orbax_checkpoint.py)",
    ),
    Reach(
        "orbax",
        "_set_monitor_op",
        (),
        "kmp.callbacks.OrbaxCheckpoint's save_best_only at a save_freq in "
        "batches (kmp/callbacks/orbax_checkpoint.py)",
    ),
    Reach(
        "progbar",
        "_seen_so_far",
        None,
        "the evaluation's progress bar (kmp/app/report.py)",
    ),
    # Imported from keras.src, where Keras exports nothing.
    Reach(
        "keras.src.backend.common.masking",
        "get_keras_mask",
        ("x",),
        "kmp.pin_float32's float32 outputs (kmp/islands/float32_outputs.py)",
    ),
    Reach(
        "keras.src.backend.common.masking",
        "set_keras_mask",
        ("x", "mask"),
        "kmp.pin_float32's float32 outputs (kmp/islands/float32_outputs.py)",
    ),
    Reach(_STATELESS, "get_stateless_scope", (), f"{_REMAT} on JAX"),
    Reach(
        _STATELESS,
        "in_stateless_scope",
        (),
        "the scaler, JAX's initialization, torch's grouped update "
        "(kmp/backend/scaler_ops.py, initialization.py, "
        "optimizer_updates.py)",
    ),
    Reach(_VARIABLES, "AutocastScope", ("dtype",), f"{_STATE}; {_REMAT}"),
    Reach(_VARIABLES, "get_autocast_scope", (), f"{_STATE}; {_REMAT}"),
    Reach(_VARIABLES, "initialize_all_variables", (), _INITIALIZATION),
    Reach(
        "keras.src.backend.common.global_state",
        "get_global_attribute",
        ("name", "default"),
        _INITIALIZATION,
    ),
    Reach(
        "keras.src.backend.jax.distribution_lib",
        "initialize_rng",
        (),
        "kmp.initialize_processes (kmp/backend/distribution.py)",
        ("jax",),
    ),
    # TensorFlow's, not Keras's: no public API either.
    Reach(
        "tensorflow.python.eager.context",
        "context",
        (),
        "the persistent XLA cache on TensorFlow (kmp/backend/settings.py)",
        ("tensorflow",),
    ),
]

# kmp's own attributes that share a name with a Keras object's private one
# (the scan below cannot tell them apart), and why they are kmp's.
OWN = {
    "_start": "kmp.app.report.StepTimes's own timer (a Callback has none)",
    "_losses": "kmp.backend.RecomputedState's own field",
}


def _model():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    model.compile(optimizer="adam", loss="mse")
    return model


def _attention():
    layer = keras.layers.MultiHeadAttention(2, 4)
    x = np.ones((1, 2, 4), "float32")
    layer(x, x)
    return layer


def _built(optimizer):
    optimizer.build([keras.Variable(np.ones((2, 2), "float32"))])
    return optimizer


OWNERS = {
    "layer": lambda: _model().layers[1],
    "dropout": lambda: keras.layers.Dropout(0.5),
    "keras_tensor": lambda: keras.Input((4,)),
    "model": _model,
    "sequential": lambda: keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(2)]
    ),
    "attention": _attention,
    "policy": lambda: keras.DTypePolicy("float32"),
    "optimizer": lambda: _built(keras.optimizers.Adam()),
    "loss_scale_optimizer": lambda: _built(
        keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    ),
    "variable": lambda: keras.Variable(np.ones(2, "float32")),
    "backup": lambda: keras.callbacks.BackupAndRestore("unused"),
    "checkpoint": lambda: keras.callbacks.ModelCheckpoint("unused.keras"),
    "orbax": lambda: keras.callbacks.OrbaxCheckpoint(_unused_directory()),
    "progbar": lambda: keras.utils.Progbar(3),
}


def _unused_directory():
    # Orbax's checkpointer makes its directory: one of the test's own,
    # gone when the process ends.
    directory = tempfile.mkdtemp(prefix="kmp_orbax_")
    atexit.register(shutil.rmtree, directory, True)
    return directory


def _broken(what, feature):
    return (
        f"Keras {keras.__version__}: {what}. This breaks {feature}; see "
        f"{NOTES}."
    )


def _owner(reach):
    if reach.owner in OWNERS:
        return OWNERS[reach.owner]()
    import importlib

    try:
        return importlib.import_module(reach.owner)
    except ImportError:
        pytest.fail(_broken(f"there is no module {reach.owner}", reach.feature))


def _id(reach):
    return f"{reach.owner.rsplit('.', 1)[-1]}.{reach.name}"


@pytest.mark.parametrize("reach", REACHES, ids=_id)
def test_each_reached_name_is_there_as_kmp_uses_it(reach):
    if reach.backends and backend.name() not in reach.backends:
        pytest.skip(f"{' and '.join(reach.backends)} only")
    owner = _owner(reach)
    kind = getattr(owner, "__name__", type(owner).__name__)
    assert hasattr(owner, reach.name), _broken(
        f"{kind} has no `{reach.name}`", reach.feature
    )
    if reach.parameters is None:
        return
    found = list(inspect.signature(getattr(owner, reach.name)).parameters)
    assert found[: len(reach.parameters)] == list(reach.parameters), _broken(
        f"`{kind}.{reach.name}` takes ({', '.join(found)}), kmp calls or "
        f"overrides it with ({', '.join(reach.parameters)})",
        reach.feature,
    )


def _feature(name):
    return next(r.feature for r in REACHES if r.name == name)


def test_keras_calls_a_quantized_layer_s_own_quantized_call():
    # kmp.fp8.observe_operands (the doctor's float8 headroom) and the
    # doctor's taps set `quantized_call` on the instance.
    layer = keras.layers.Dense(4)
    layer.build((None, 4))
    layer.quantize("float8")
    calls = []
    stock = layer.quantized_call

    def observed(inputs, *args, **kwargs):
        calls.append(inputs.shape)
        return stock(inputs, *args, **kwargs)

    layer.quantized_call = observed
    layer(np.ones((2, 4), "float32"))
    assert calls == [(2, 4)], _broken(
        "a float8 layer's call no longer goes through the instance's "
        "`quantized_call`",
        _feature("quantized_call"),
    )


def test_keras_float8_layers_keep_the_variables_kmp_reads():
    # kmp.fp8 (operands, the doctor) and kmp.scaling.keras_float8 read
    # them by these names; the output-gradient ones are "overwritten with
    # their gradient".
    layer = keras.layers.Dense(4)
    layer.build((None, 4))
    layer.quantize("float8")
    names = {v.name: v for v in layer.variables}
    expected = {
        "inputs_scale",
        "kernel_scale",
        "inputs_amax_history",
        "kernel_amax_history",
        "outputs_grad_scale",
        "outputs_grad_amax_history",
    }
    feature = (
        "kmp.fp8's reading of Keras's float8 layers, the doctor's headroom "
        "and the scaler's float8 state (kmp/fp8/operands.py, "
        "kmp/scaling/keras_float8.py)"
    )
    assert expected <= set(names), _broken(
        f"a float8 Dense has variables {sorted(names)}", feature
    )
    assert all(
        names[n].overwrite_with_gradient
        for n in ("outputs_grad_scale", "outputs_grad_amax_history")
    ), _broken("float8's output-gradient state is not overwritten", feature)
    assert tuple(layer.kernel.shape) == (4, 4), _broken(
        "a float8 Dense's `kernel` is not its float kernel", feature
    )


def test_keras_rematerializes_a_layer_by_its_remat_mode():
    # kmp.rematerialize sets `_remat_mode` on a built layer and its own
    # `rematerialized_call` on the instance; Keras reads both per call.
    layer = keras.layers.Dense(4)
    layer.build((None, 4))
    layer._remat_mode = keras.RematScope(mode="full")
    calls = []

    def rematerialized_call(layer_call, *args, **kwargs):
        calls.append(len(args))
        return layer_call

    layer.rematerialized_call = rematerialized_call
    layer(np.ones((2, 4), "float32"))
    assert calls == [1], _broken(
        "a layer's `_remat_mode` no longer makes its call go through "
        "`rematerialized_call`",
        _feature("_remat_mode"),
    )


def test_keras_lists_a_variable_made_in_a_deferring_scope():
    # backend.initialized_together gives these their first values.
    from keras.src.backend.common import global_state

    with keras.StatelessScope(initialize_variables=False):
        variable = keras.Variable(keras.initializers.Zeros(), shape=(2,))
        listed = global_state.get_global_attribute("uninitialized_variables")
    assert any(v is variable for v in listed or ()), _broken(
        "a variable made under StatelessScope(initialize_variables=False) "
        'is not in the global attribute "uninitialized_variables"',
        _feature("initialize_all_variables"),
    )
    assert variable._initializer is not None


def test_keras_counts_the_names_it_makes_up_in_a_global_attribute():
    # kmp.saving.keras_names.names_made reads the counts before and after
    # a load: the n-th name of a class is `dense_n`, the first `dense`.
    from keras.src.backend.common import global_state

    def counts():
        found = global_state.get_global_attribute("object_name_uids") or {}
        return found.get("dense", 0)

    before = counts()
    layer = keras.layers.Dense(1)
    assert counts() == before + 1, _broken(
        'a layer made without a name no longer adds to "object_name_uids"',
        "kmp.load_model of a checkpoint directory (kmp/saving/keras_names.py)",
    )
    assert layer.name == ("dense" if before == 0 else f"dense_{before}")


def test_stock_optimizers_live_in_keras_src_optimizers():
    # kmp.memory finds the public class a stock optimizer is (on torch an
    # instance of its torch twin) by this module prefix.
    assert keras.optimizers.Adam.__module__.startswith(
        "keras.src.optimizers."
    ), _broken(f"Adam is defined in {keras.optimizers.Adam.__module__}", _STATE)


def _kmp_source():
    paths = [*ROOT.joinpath("kmp").rglob("*.py")]
    return {
        p: ast.parse(p.read_text())
        for p in paths + [*ROOT.joinpath("examples").rglob("*.py")]
    }


def _private_uses(tree):
    """Private names in a module: attributes read or written, names
    given to getattr-like calls or in tuples of names, and methods a
    class defines (an override of Keras's)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"_[a-z]\w*", node.value):
                yield node.value
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield item.name


def _imports(tree):
    """(module, name) of each import from keras.src or tensorflow.python,
    and of each `private_import` call."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(("keras.src", "tensorflow.python")):
                for alias in node.names:
                    yield node.module, alias.name
        elif isinstance(node, ast.Call):
            func = node.func
            called = getattr(func, "attr", getattr(func, "id", None))
            if called == "private_import":
                module, name = (a.value for a in node.args[:2])
                yield module, name


def _keras_private_names():
    """The private names of the Keras objects in OWNERS, on this
    backend (their classes' and the instances' own)."""
    names = set()
    for make in OWNERS.values():
        owner = make()
        names |= {n for n in dir(owner) if re.fullmatch(r"_[a-z]\w*", n)}
    return names


def _listed(module, name):
    """Whether REACHES has `from module import name`: the name itself,
    or, where `name` is a module, a name of it."""
    return any(
        (r.owner, r.name) == (module, name) or r.owner == f"{module}.{name}"
        for r in REACHES
    )


def test_every_reach_is_listed():
    used = collections.defaultdict(set)
    imported = collections.defaultdict(set)
    for path, tree in _kmp_source().items():
        where = str(path.relative_to(ROOT))
        for name in _private_uses(tree):
            used[name].add(where)
        for module, name in _imports(tree):
            imported[(module, name)].add(where)
    listed = {r.name for r in REACHES if r.owner in OWNERS}
    unlisted = {
        name: sorted(used[name])
        for name in set(used) & _keras_private_names()
        if name not in listed and name not in OWN
    }
    assert not unlisted, (
        "kmp uses private names of Keras objects that REACHES lacks: "
        f"{unlisted}; add each (and to {NOTES})"
    )
    unlisted = {
        f"{module}.{name}": sorted(where)
        for (module, name), where in imported.items()
        if not _listed(module, name)
    }
    assert not unlisted, (
        f"kmp imports names of private modules that REACHES lacks: "
        f"{unlisted}; add each (and to {NOTES})"
    )
    modules = {m for m, _ in imported} | {f"{m}.{n}" for m, n in imported}
    stale = [
        _id(r)
        for r in REACHES
        if r.name not in used
        and (r.owner, r.name) not in imported
        and not (r.owner in modules and r.name in used)
    ]
    assert not stale, f"REACHES lists names kmp no longer uses: {stale}"


def test_keras_version_reads_the_release(monkeypatch):
    running = ".".join(str(part) for part in backend.keras_version())
    assert keras.__version__.startswith(running)
    monkeypatch.setattr(keras, "__version__", "3.16.0.dev2026102704")
    assert backend.keras_version() == (3, 16, 0)
    monkeypatch.setattr(keras, "__version__", "3.15.1")
    assert backend.keras_version() == (3, 15, 1)


def test_a_missing_private_name_fails_with_the_feature_and_the_versions(
    monkeypatch,
):
    monkeypatch.setattr(keras, "__version__", "3.99.0")
    with pytest.raises(backend.KerasInternalsError) as raised:
        backend.private_import("keras.src.no_such_module", "f", "kmp.thing")
    message = str(raised.value)
    assert "kmp.thing uses Keras's private `keras.src.no_such_module.f`" in (
        message
    )
    assert "Keras 3.99.0 does not have" in message
    assert all(version in message for version in backend.TESTED_KERAS)
    with pytest.raises(backend.KerasInternalsError, match="`Dense._gone`"):
        backend.private_attribute(keras.layers.Dense(2), "_gone", "kmp.it")
    in_scope = backend.private_import(_STATELESS, "in_stateless_scope", "k")
    assert in_scope() is False


def test_rematerialize_names_what_this_keras_lacks(monkeypatch):
    model = _model()
    monkeypatch.delattr(model, "_remat_mode")
    with pytest.raises(
        backend.KerasInternalsError,
        match="kmp.rematerialize uses Keras's private `Functional._remat_mode",
    ):
        kmp.rematerialize(model, keras.layers.Dense)
