"""The numerics doctor: `kmp.diagnose(model, data)`.

Runs a few batches through the model twice, both times with the same
weights, the same batch statistics and no dropout: once with every layer
computing in float32 (the reference), once under the mixed policy being
tested, with the loss multiplied by the loss scale. Each layer's outputs,
the gradients by those outputs (activation gradients) and the gradients
by its weights are compared with float16's (or bfloat16's) range and with
the reference, layer by layer; `kmp.diagnosis` turns the counts into
verdicts.

Layers are observed through `kmp.taps` (every layer, nested ones and
those of subclassed models included); the float32 reference switches the
layers' dtype policies for the duration of its pass. Both passes go
through `model.stateless_call`, so no variable (weights, batch-norm
statistics, seeds) changes, and policies and wrapped `call`s are
restored in a `finally`.
"""

import inspect
import math
from typing import Callable
from typing import NamedTuple

import keras
from keras import ops

from kmp import backend
from kmp import doctor_inputs
from kmp.diagnosis import Diagnosis
from kmp.diagnosis import build_diagnosis
from kmp.islands import all_layers
from kmp.numerics import FORMATS
from kmp.numerics import Format
from kmp.numerics import RangeCounter
from kmp.taps import LOOPING
from kmp.taps import Taps
from kmp.taps import dtype_policies
from kmp.taps import observed_layers

# Keras computes these in float32 under a mixed policy (their outputs are
# cast back), so their weight gradients are float32 ones.
_FLOAT32_INSIDE = (
    keras.layers.BatchNormalization,
    keras.layers.LayerNormalization,
    keras.layers.GroupNormalization,
)


def _owners(layers, model):
    """Index of the innermost observed layer owning each trainable
    variable; `len(layers)` for the model's own (or a loop's inner)."""
    owner = {}
    for index, layer in enumerate(layers):  # parents come before children
        for variable in layer.trainable_variables:
            owner[id(variable)] = index
    return [owner.get(id(v), len(layers)) for v in model.trainable_variables]


def diagnose(
    model: keras.Model,
    data,
    loss=None,
    batches: int = 2,
    loss_scale: float | None = None,
    policy: str | None = None,
    batch_size: int = 32,
    jit_compile: bool | str = "auto",
    verbose: bool = True,
) -> Diagnosis:
    """Finds the layers that float16 (or bfloat16) hurts, and says why.

    Runs `batches` batches through `model` twice with the same weights:
    once in float32 (the reference), once under the mixed policy, with the
    loss multiplied by the loss scale. Per layer it measures the outputs
    (largest magnitude, the fractions that overflow, are lost below the
    smallest subnormal or are subnormal in the half format, the relative
    error against float32), the gradients by the outputs and by the
    weights (the same fractions without scaling and at the loss scale),
    and gives verdicts: layers to pin to float32, whether the loss scale
    is too low or too high with the range of scales that keeps 99 % of
    gradient values representable, or that no scale does
    (`mixed_bfloat16` then). The model, its weights, its optimizer and the
    global dtype policy are left as they were.

    Args:
        model: A built Keras model (Sequential, Functional or subclassed).
        data: `(x, y)` arrays, a `tf.data.Dataset`, a
            `keras.utils.PyDataset` or an iterable of `(x, y)` batches.
        loss: The loss as `compile` takes it (a name, function or
            `keras.losses.Loss` for all outputs, a list, or a dict by
            output name); default: the model's compiled loss. Loss
            weights, regularization terms and sample weights are not
            applied.
        batches: How many batches to run.
        loss_scale: The loss scale to test; default: the model's
            `LossScaleOptimizer`'s current scale, else 1.
        policy: The mixed policy to test: `"mixed_float16"` or
            `"mixed_bfloat16"`. Default: the model's own (half-precision
            layers as built, pinned ones float32); a float32 model is
            tested under `"mixed_float16"`. Given a policy, the model's
            half-precision layers switch to it; in a float32 model every
            layer does except outputs and softmax/sigmoid layers, which
            stay float32 as `kmp.pin_float32` would leave them.
        batch_size: Batch size when `data` is arrays.
        jit_compile: Compile both passes with XLA; `"auto"`: the model's
            own `jit_compile` (Keras: XLA, except TensorFlow on a CPU-only
            machine).
        verbose: Show a progress bar.

    Returns:
        A `kmp.diagnosis.Diagnosis`: `.show()`, `.summary()`, `.to_json()`,
        `.plot(path)`.

    Example:

    ```python
    kmp.enable("mixed_float16")
    model = build_model()
    model.compile(optimizer=kmp.wrap("adam"), loss="mse")
    report = kmp.diagnose(model, (x_train, y_train), batch_size=128)
    report.show()              # per-layer table, verdicts, summary
    report.plot("doctor.png")  # gradient magnitudes vs float16's range
    ```
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"diagnose expects a keras.Model, got {type(model).__name__}."
        )
    if not model.built or not model.trainable_variables:
        raise ValueError(
            f"Model {model.name!r} is not built or has no trainable "
            "weights. Build it first (call it on a batch, or "
            "model.build(input_shape)); diagnose does not create weights."
        )
    for name, value in (("batches", batches), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"`{name}` must be an integer >= 1, got {value!r}."
            )
    if loss_scale is not None and not (
        isinstance(loss_scale, (int, float)) and 0 < loss_scale < math.inf
    ):
        raise ValueError(
            "`loss_scale` must be a positive finite number, got "
            f"{loss_scale!r}."
        )
    policy, switched = doctor_inputs.policy_under_test(model, policy)
    scale = float(loss_scale or doctor_inputs.current_scale(model, policy))
    fmt = FORMATS[keras.DTypePolicy(policy).compute_dtype]
    loss_fn = doctor_inputs.loss_function(model, loss)
    found = doctor_inputs.batches_of(data, batches, batch_size)
    if not found:
        raise ValueError("`data` yielded no batches.")
    if jit_compile == "auto":
        jit_compile = _model_jit_compile(model)

    setup = _Setup(
        model,
        found,
        loss_fn,
        scale,
        policy,
        switched,
        fmt,
        jit_compile,
        verbose,
    )

    def run(layers):
        return _run(setup, layers)

    notes = []
    layers, top_level = observed_layers(model), observed_layers(model, False)
    try:
        counters, dtypes, reference_dtypes = run(layers)
    except Exception as error:
        if len(top_level) == len(layers):
            raise
        # A layer may call its inner layers inside a loop or a traced
        # transformation (lax.scan, tf.while_loop in a graph, remat),
        # where a tap cannot reach: observe the model's own layers only.
        # If that fails too, the first error is the one to see.
        try:
            counters, dtypes, reference_dtypes = run(top_level)
        except Exception:
            raise error from None
        layers = top_level
        notes.append(
            "observing nested layers failed "
            f"({type(error).__name__}: {_first_line(error)}); "
            "only the model's top-level layers are observed"
        )
    notes += [
        f"{layers[i].path or layers[i].name} computed in {dtype} in the "
        "float32 reference (its code fixes the dtype)"
        for i, dtype in sorted(reference_dtypes.items())
        if dtype != "float32"
    ]
    if switched and not any(
        x.compute_dtype in doctor_inputs.HALF for x in all_layers(model)
    ):
        notes.append(
            f"float32 model: tested under {policy} with its outputs and "
            "softmax/sigmoid layers kept float32, as kmp.pin_float32 would"
        )
    if not getattr(model, "outputs", None):
        notes.append(
            "subclassed model: outputs are observed at each layer; "
            "operations its call() runs between layers are not"
        )
    notes += [
        f"{layer.path or layer.name} ({type(layer).__name__}) runs its inner "
        "layers in a loop: observed as a whole"
        for layer in layers
        if isinstance(layer, LOOPING)
    ]
    return build_diagnosis(
        model=model,
        layers=layers,
        order=list(dtypes),
        counters=counters,
        dtypes=dtypes,
        policy=policy,
        scale=scale,
        batches=len(found),
        examples=sum(len(keras.tree.flatten(x)[0]) for x, _ in found),
        float32_inside=[isinstance(x, _FLOAT32_INSIDE) for x in layers],
        notes=notes,
    )


def _first_line(error):
    return (str(error).splitlines() or [""])[0][:120]


def _model_jit_compile(model):
    """The model's `jit_compile`, without Keras's first read storing its
    resolution of "auto" on the model."""
    saved = getattr(model, "_jit_compile", None)
    try:
        return bool(getattr(model, "jit_compile", True))
    finally:
        if hasattr(model, "_jit_compile"):
            model._jit_compile = saved


class _Setup(NamedTuple):
    """What both passes share; checked by `diagnose`."""

    model: keras.Model
    found: list  # (x, y) batches
    loss_fn: Callable
    scale: float
    policy: str
    switched: list  # layers given `policy` in the mixed pass
    fmt: Format
    jit_compile: bool
    verbose: bool


def _run(setup, layers):
    """Both passes over every batch; returns the counters and dtypes."""
    model, found, loss_fn, scale, policy, switched, fmt = setup[:7]
    taps = Taps(layers)
    every_layer = all_layers(model)
    counters = {
        kind: [
            RangeCounter(fmt, 1.0 if kind == "activations" else scale)
            for _ in range(len(layers) + 1)
        ]
        for kind in ("activations", "activation_gradients", "weight_gradients")
    }
    dtypes, reference_dtypes = {}, {}  # layer index -> dtype, call order

    # As Keras's trainers do: `training` only where call() takes it.
    parameters = inspect.signature(model.call).parameters
    training = {"training": True} if "training" in parameters else {}

    def make_pass(loss_multiplier):
        def loss_of(values, args, tap):
            x, y, non_trainable = args
            taps.start(tap)
            try:
                y_pred, _ = model.stateless_call(
                    values, non_trainable, x, **training
                )
            finally:
                taps.stop()
            return ops.multiply(loss_fn(y, y_pred), loss_multiplier)

        return backend.taped_gradients(loss_of, setup.jit_compile)

    values = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    owners = _owners(layers, model)
    progress = keras.utils.Progbar(len(found), unit_name="batch")
    with taps:
        reference_pass, mixed_pass = make_pass(1.0), make_pass(scale)
        for step, (x, y) in enumerate(found):
            with dtype_policies(every_layer, "float32"):
                reference = reference_pass(values, x, y, non_trainable)
            with dtype_policies(switched, policy):
                mixed = mixed_pass(values, x, y, non_trainable)
            _count(counters, reference, mixed, owners, dtypes, reference_dtypes)
            if setup.verbose:
                progress.update(step + 1)
    return counters, dtypes, reference_dtypes


def _count(counters, reference, mixed, owners, dtypes, reference_dtypes):
    """Adds one batch's two passes to the counters."""
    _, keys, ref_taps, ref_value_grads, ref_tap_grads = reference
    _, mixed_keys, mixed_taps, mixed_value_grads, mixed_tap_grads = mixed
    if keys != mixed_keys:
        raise RuntimeError(
            "The model called its layers in a different order in float32 "
            "and under the mixed policy; diagnose cannot pair their outputs."
        )
    for j, index in enumerate(keys):
        dtypes.setdefault(
            index, keras.backend.standardize_dtype(mixed_taps[j].dtype)
        )
        reference_dtypes.setdefault(
            index, keras.backend.standardize_dtype(ref_taps[j].dtype)
        )
        counters["activations"][index].add(
            ops.convert_to_numpy(ref_taps[j]),
            ops.convert_to_numpy(mixed_taps[j]),
        )
        if ref_tap_grads[j] is not None:
            counters["activation_gradients"][index].add(
                ops.convert_to_numpy(ref_tap_grads[j]),
                None
                if mixed_tap_grads[j] is None
                else ops.convert_to_numpy(mixed_tap_grads[j]),
            )
    for index, ref_grad, mixed_grad in zip(
        owners, ref_value_grads, mixed_value_grads
    ):
        if ref_grad is not None:
            counters["weight_gradients"][index].add(
                ops.convert_to_numpy(ref_grad),
                None
                if mixed_grad is None
                else ops.convert_to_numpy(mixed_grad),
            )
