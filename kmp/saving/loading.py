"""`kmp.load_model`: a `.keras` file back with what Keras's load leaves out.

Keras's `load_model` rebuilds each layer from its config. Two things kmp
set up do not come back that way, and `kmp.load_model` puts them back:

- Float32 islands inside layers that other layers make in code
  (KerasHub's attention, a custom block's `MultiHeadAttention`): their
  softmax has no weights, hence no path a `DTypePolicyMap` could name,
  so the load rebuilds it in half precision. `kmp.pin_float32` runs
  again on a model the file shows was pinned (it changes nothing that is
  pinned already), and KerasHub's position embeddings repeat one
  example's embedding again (how a layer runs, which no file keeps). A
  model saved unpinned comes back as saved: its predictions are the
  saved model's, as keras-io's saving guide checks.
- The compiled optimizer, scaler included, of a model whose class has
  its own `compile` (KerasHub's tasks): Keras skips `compile` on load
  and warns. Here the model is compiled with the file's compile config,
  and the optimizer's saved state (slots, loss scale) is loaded into it.

Float8 layers and the islands a config lists need nothing: Keras's load
keeps them (`kmp.float8` and `kmp.pin_float32` record them so).

An `OrbaxCheckpoint` directory loads the same way, and more comes back
than from Keras's load of it: the weights and optimizer state it drops
by path (`kmp.saving.checkpoint_dirs`).

What cannot come back is said, never hidden: the optimizer state of a
file whose optimizer differs from the one the load builds (a scaler that
Keras's `compile` added under mixed_float16, loaded under float32) is one
warning line naming the fix. Bad input is a `kmp.InputError`: a file that
is not a Keras archive or is a damaged one, a class that nothing
imported registers.
"""

import contextlib
import json
import re
import warnings
import zipfile
import zlib

import keras

from kmp.errors import InputError
from kmp.fp8.convert import use_default_matmul
from kmp.islands import BatchNormalization
from kmp.islands import Float32Activation
from kmp.islands import Float32Softmax
from kmp.islands import MultiHeadAttention
from kmp.islands import casts_output
from kmp.islands import pin_float32
from kmp.islands import pinned_in
from kmp.model_layers import fed_outputs
from kmp.model_layers import output_layers
from kmp.saving.checkpoint_dirs import is_checkpoint_dir
from kmp.saving.checkpoint_dirs import read_checkpoint
from kmp.saving.checkpoint_dirs import restore_dropped
from kmp.saving.held_values import assigning_by_path
from kmp.saving.keras_names import Names
from kmp.saving.keras_names import names_made
from kmp.saving.saved_compile import SKIPPED_OPTIMIZER
from kmp.saving.saved_compile import compile_as_saved
from kmp.saving.saved_compile import lost_optimizer
from kmp.saving.saved_compile import saved_unbuilt
from kmp.scaling import LossScaleOptimizer
from kmp_config.names import HALF_DTYPES
from kmp_config.names import MIXED_POLICIES

# Keras's warning when it skips a custom `compile` on load: kmp does it.
_SKIPPED_COMPILE = "`compile()` was not called as part of model loading"
# The classes `kmp.pin_float32` puts in.
_ISLAND_CLASSES = (
    BatchNormalization,
    Float32Activation,
    Float32Softmax,
    MultiHeadAttention,
)
# Keras's error when a config names a class nothing registered.
_MISSING_CLASS = re.compile(r"Could not locate (?:class|function) '([^']+)'")


def load_model(
    filepath,
    custom_objects=None,
    compile=True,
    safe_mode=True,
    policy=None,
    pin=None,
):
    """Loads a `.keras` model, or the latest step of an `OrbaxCheckpoint`
    directory, as `keras.saving.load_model` does, then puts back kmp's
    float32 islands and a custom-compiled model's optimizer, and says
    what it could not put back.

    Call it under the policy you train with (`kmp.enable(...)` first), or
    pass `policy="saved"` to load under the one the file's layers record.
    After Keras's load:

    - if any layer computes in float16 or bfloat16 and the model was
      pinned, `kmp.pin_float32` runs on it again: the softmax islands
      that a `.keras` file cannot keep (inside KerasHub's attention
      layers, for one) come back, and everything pinned already stays as
      it is. "Was pinned": every output of the loaded mixed model is
      float32 (`kmp.pin_float32`'s, or yours as Keras's mixed-precision
      guide writes it), or it holds one of `kmp.layers`' island classes,
      or the archive keeps `kmp.pin_float32`'s mark of the saved model
      (`kmp.islands.pin_mark`; a feature extractor whose outputs it
      cast shows no other); or the load changes the dtype the model
      computes in (a float32 file loaded under `kmp.enable(...)`:
      pinned as a model built there would be); or its file cannot say
      (a subclassed `keras.Model`, whose outputs no config records). A
      Functional, Sequential or KerasHub model saved unpinned and loaded
      under the policy it was saved with comes back as it was saved,
      predictions included;
    - if the model's class has its own `compile` (KerasHub's tasks),
      which Keras does not call on load, the model is compiled with the
      file's compile config (kmp's `LossScaleOptimizer` included) and the
      optimizer's saved state is loaded, so training resumes where it
      stopped;
    - float8 layers get the matmul `kmp.float8` gives by default (kmp's
      own on JAX), which the file cannot keep for layers the model
      rebuilds from code;
    - if the file's optimizer state does not fit the optimizer the load
      built (a scaler Keras's own `compile` added under mixed_float16,
      loaded under another policy), the optimizer starts afresh, and a
      `UserWarning` says so in one line, with the fix;
    - from a checkpoint directory, the saved values Keras's load drops
      because no variable of the rebuilt model has their path (every
      weight of a Sequential or subclassed model that `fit` built:
      keras-team/keras#23251) are assigned to the variables they belong
      to (`kmp.saving.checkpoint_dirs`), and a `UserWarning` names any still
      lost. The pin mark is read from the checkpoint's assets.

    Args:
        filepath: Path to a `.keras` file, or a directory an
            `OrbaxCheckpoint` wrote (needs orbax-checkpoint; loads
            compiled only, as Keras's load does).
        custom_objects: As for `keras.saving.load_model`.
        compile: Whether to compile the model as it was saved.
        safe_mode: As for `keras.saving.load_model`.
        policy: The dtype policy to load under: `None` (the global one),
            `"saved"` (the mixed policy the file's layers record, else
            float32; what `kmp audit` and `kmp doctor` load under), or a
            policy name. The global policy is left as it was.
        pin: `None` pins the float32 islands again where the model was
            pinned (above); `True` pins them whatever the file says;
            `False` gives the layers as Keras's load rebuilds them, which
            is what `kmp.audit` of a file checks. Unless `False`, float8
            layers get kmp's matmul (above).

    Returns:
        The model.

    Raises:
        kmp.InputError: `filepath` is not a `.keras` Keras archive or a
            checkpoint directory with a model config, is a damaged
            archive (a member whose checksum fails), or names a class
            that nothing imported registers.

    Example:

    ```python
    kmp.enable("mixed_bfloat16")
    model = kmp.load_model("gpt2.keras")  # pinned, compiled, resumable
    model.fit(data, epochs=1)
    ```
    """
    checkpoint = None
    if is_checkpoint_dir(str(filepath)):
        if not compile:
            raise InputError(
                f"{filepath}: Keras's load of a checkpoint directory fails "
                "with compile=False (Keras 3.15.1: its state tree reads the "
                "model's optimizer): load it with compile=True."
            )
        checkpoint = read_checkpoint(str(filepath))
        config = checkpoint.config
    else:
        config = _read_config(filepath)
    if policy == "saved":
        policy = saved_policy(config)
    unnamed = compile and _names_no_optimizer(config)
    by_path, held = contextlib.ExitStack(), set()
    names = Names(made=set(), given=set(), made_up={})
    if checkpoint is not None:
        by_path.enter_context(assigning_by_path(filepath, held))
        by_path.enter_context(names_made(names))
    with _global_policy(policy), _damaged_archive(filepath), by_path:
        model = _keras_load(
            filepath, custom_objects, compile, safe_mode, unnamed
        )
        if compile and _own_compile(model):
            compile_as_saved(
                model, config, filepath, custom_objects, safe_mode, unnamed
            )
    if checkpoint is not None:
        restore_dropped(
            model, filepath, checkpoint, compile and not unnamed, held, names
        )
    if unnamed:
        warnings.warn(_no_optimizer(filepath, model), stacklevel=2)
    if pin is not False:
        marked = checkpoint.pinned if checkpoint else _marked(filepath)
        if pin or _was_pinned(model, config, marked):
            if _compute(model) != "float32":
                pin_float32(model)
        use_default_matmul(model)
    return model


def saved_policy(config) -> str:
    """The mixed policy a `.keras` file's layers record (its parsed
    `config.json`), or "float32": a layer's `DTypePolicy` (a quantized
    one's source policy too) or a `dtype` given by name. mixed_float16
    wins where both appear (it needs the scaler)."""
    found = _policy_names(config)
    return next((p for p in MIXED_POLICIES if p in found), "float32")


def _policy_names(config) -> set:
    """The names of the policies a parsed `config.json` records: a
    `DTypePolicy`'s (a quantized one's source policy too), a `dtype` given
    by name."""
    found = set()
    for node in _nodes(config):
        if str(node.get("class_name", "")).endswith("DTypePolicy"):
            inner = node.get("config") or {}
            found.update(inner.get(k) for k in ("name", "source_name"))
        if isinstance(node.get("dtype"), str):
            found.add(node["dtype"])
    return {str(name) for name in found if name is not None}


def _nodes(config):
    """Every dict in a parsed `config.json`, nested ones included."""
    stack = [config]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            yield node
            stack.extend(node.values())


def _compute(model) -> str:
    """The 16-bit dtype the loaded model's layers compute in, or "float32"
    (float16 where both appear)."""
    found = {
        getattr(layer, "compute_dtype", None)
        for layer in model._flatten_layers()
    }
    return next((d for d in HALF_DTYPES if d in found), "float32")


def _saved_compute(config) -> str:
    """The 16-bit dtype the file's layers computed in, or "float32", from
    the policies its config records (`"mixed_bfloat16"`, a bare
    `"bfloat16"` of bfloat16 master weights; not `Float32Compute`'s
    `"float32_over_bfloat16"`, a float32 island)."""
    names = {
        name
        for name in _policy_names(config)
        if not name.startswith("float32_over_")
    }
    if any(re.search(r"(?<!b)float16", name) for name in names):
        return "float16"
    return "bfloat16" if any("bfloat16" in n for n in names) else "float32"


def _was_pinned(model, config, marked) -> bool:
    """Whether `kmp.load_model` pins the loaded `model` again by default
    (its docstring says when, and why; `marked`: the file keeps
    `kmp.pin_float32`'s mark of the saved model)."""
    loaded = _compute(model)
    if loaded == "float32":
        return False
    outputs = output_layers(model)
    if _saved_compute(config) != loaded or outputs is None:
        return True
    if marked:
        return True
    # `pin_float32`'s marks that a file keeps: every output float32 (a
    # Functional config's, or a KerasHub task's head through its
    # backbone's `DTypePolicyMap`), or a class of its own (a
    # MultiHeadAttention it swapped). A float32 layer elsewhere is no
    # mark: `Normalization(dtype="float32")`, say, is a user's own fix.
    # An output that a layer of layers makes, pinning only casts (its
    # 16-bit policy is in the file): the others decide, one at least.
    float32 = [layer.compute_dtype == "float32" for layer in outputs]
    fed = fed_outputs(model)
    cast = [casts_output(layer, fed) for layer in outputs]
    if any(float32) and all(f or c for f, c in zip(float32, cast)):
        return True
    return any(
        isinstance(layer, _ISLAND_CLASSES) for layer in model._flatten_layers()
    )


def _marked(filepath) -> bool:
    """Whether a `.keras` file keeps `pin_float32`'s own mark, the saved
    model's (a model's inside it, pinned on its own, is elsewhere in the
    archive)."""
    with zipfile.ZipFile(str(filepath)) as archive:
        return pinned_in(archive)


def _read_config(filepath):
    """The archive's `config.json`, parsed; `InputError` for anything
    that is not a `.keras` Keras archive."""
    path = str(filepath)
    if not path.endswith(".keras"):
        raise InputError(
            f"kmp.load_model reads .keras files and OrbaxCheckpoint "
            f"directories, got {path!r}; load other formats with "
            "keras.saving.load_model."
        )
    try:
        with zipfile.ZipFile(path) as archive, _damaged_archive(path):
            return json.loads(archive.read("config.json"))
    except InputError:
        raise  # a damaged member: said so
    except (zipfile.BadZipFile, KeyError, ValueError) as error:
        raise InputError(
            f"{path} is not a Keras archive ({error}); save the model with "
            "model.save('model.keras')."
        ) from None


@contextlib.contextmanager
def _damaged_archive(filepath):
    """A member of the archive that does not read back (a checksum that
    does not match, a truncated or corrupt stream) as an `InputError`:
    the zip's directory and `config.json` were fine, the weights not."""
    try:
        yield
    except (zipfile.BadZipFile, zlib.error, EOFError) as error:
        raise InputError(
            f"{filepath} is a damaged Keras archive ({type(error).__name__}:"
            f" {error}); copy it again, or save the model again with "
            "model.save('model.keras')."
        ) from None


@contextlib.contextmanager
def _global_policy(policy):
    """Keras's global policy set to `policy` inside (`None`: as it is),
    without `kmp.enable`'s note about the hardware: a load is not a
    choice of policy."""
    previous = keras.config.dtype_policy()
    if policy is not None:
        keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _keras_load(filepath, custom_objects, compile, safe_mode, unnamed):
    """Keras's load; a class nothing registered is an `InputError`
    naming it, and lost optimizer state one warning line (none when the
    file names no optimizer, `unnamed`: `_no_optimizer` says why)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = keras.saving.load_model(
                filepath,
                custom_objects=custom_objects,
                compile=compile,
                safe_mode=safe_mode,
            )
        except TypeError as error:
            missing = _MISSING_CLASS.search(str(error))
            if missing is None:
                raise
            unknown = InputError(
                f"{filepath} uses the class {missing.group(1)!r}, which no "
                "imported module registers: import the code that defines it "
                "(registered with keras.saving.register_keras_serializable) "
                "before loading, or pass custom_objects."
            )
            unknown.class_name = missing.group(1)  # for the command's hint
            raise unknown from None
    custom_compile = _own_compile(model)
    skipped = []  # Keras's words for each optimizer whose state it skipped
    for warning in caught:
        text = str(warning.message)
        if _SKIPPED_COMPILE in text:
            continue  # kmp compiles it (`compile_as_saved`)
        if text.startswith(SKIPPED_OPTIMIZER):
            if not (custom_compile or unnamed):
                skipped.append(text)
            continue  # else unbuilt until `compile_as_saved` loads it
        warnings.warn_explicit(
            warning.message, warning.category, warning.filename, warning.lineno
        )
    if skipped and not saved_unbuilt(filepath):
        # One line: the scaler's inner optimizer is skipped with it.
        warnings.warn(lost_optimizer(filepath, skipped[0]), stacklevel=3)
    return model


def _own_compile(model) -> bool:
    """Whether the loaded object is a model whose class has a `compile` of
    its own (a file may hold a layer: `FeatureSpace.save`; on torch every
    layer has `torch.nn.Module.compile`)."""
    return isinstance(model, keras.Model) and (
        type(model).compile is not keras.Model.compile
    )


def _names_no_optimizer(config) -> bool:
    """Whether the file was compiled (it has a compile config) but its
    compile config names no optimizer: Keras 3.15's `.h5` save removes it
    from the model's own compile config (its legacy `model_metadata` pops
    it in place; 3.16 pops it from a copy), so each later `.keras` save of
    that model lacks it too."""
    compile_config = config.get("compile_config")
    # An uncompiled model's file has an empty one: nothing to lose.
    return bool(compile_config) and "optimizer" not in compile_config


def _no_optimizer(filepath, model):
    """The line that says a file's model came back without its optimizer."""
    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", None)
    built = "none" if optimizer is None else type(inner or optimizer).__name__
    if inner is not None:
        owner = "kmp" if isinstance(optimizer, LossScaleOptimizer) else "Keras"
        built += f", in {owner}'s LossScaleOptimizer"
    return (
        f"kmp.load_model: {filepath}: the file's compile config names no "
        f"optimizer, so the model was compiled with a default one ({built})"
        " and the optimizer's saved state (slots, loss scale) is lost. "
        "Saving a model to .h5 (model.save('x.h5'), ModelCheckpoint('x.h5')) "
        "removes the optimizer from its compile config, for every later "
        ".keras save too: save .keras files only, and compile the loaded "
        "model again with optimizer=kmp.wrap(...) to train on."
    )
