"""Stage 1 of the doctor: what `kmp.diagnose` runs on.

`prepare` checks `diagnose`'s arguments at the boundary (each error says
what was passed and what is allowed) and resolves them into one `Inputs`
record: the batches, the loss as a function, the policy under test and
the layers it applies to, the loss scale, the half format, and whether to
compile. Every later stage reads that record; none comes back here.
"""

import itertools
import math
from typing import Callable
from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from kmp.doctor.numerics import FORMATS
from kmp.doctor.numerics import Format
from kmp.errors import InputError
from kmp.errors import InputTypeError
from kmp.islands import is_sensitive
from kmp.model_layers import all_layers
from kmp.model_layers import output_layers
from kmp.scaling import LossScaleOptimizer
from kmp.scaling import ScaleRule
from kmp_config.names import MIXED_POLICY


class Inputs(NamedTuple):
    """What both passes share, checked.

    Attributes:
        model: The built model.
        batches: `(x, y)` batches of NumPy values.
        loss_fn: `(y, y_pred) -> scalar`, as `loss_function` builds it.
        scale: The loss scale under test.
        policy: The mixed policy under test (`"mixed_float16"`, ...).
        switched: The layers given `policy` in the mixed pass.
        fmt: The half-precision `Format` of `policy`.
        jit_compile: Compile both passes with XLA.
        scale_bounds: `(min_scale, max_scale)`: the loss scales the
            model's scaler can reach.
    """

    model: keras.Model
    batches: list
    loss_fn: Callable
    scale: float
    policy: str
    switched: list
    fmt: Format
    jit_compile: bool
    scale_bounds: tuple


def prepare(
    model, data, loss, batches, loss_scale, policy, batch_size, jit_compile
) -> Inputs:
    """Checks `kmp.diagnose`'s arguments; see its docstring for each."""
    if not isinstance(model, keras.Model):
        raise InputTypeError(
            f"diagnose expects a keras.Model, got {type(model).__name__}."
        )
    if not model.built or not model.trainable_variables:
        raise InputError(
            f"Model {model.name!r} is not built or has no trainable "
            "weights. Build it first (call it on a batch, or "
            "model.build(input_shape)); diagnose does not create weights."
        )
    for name, value in (("batches", batches), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(
                f"`{name}` must be an integer >= 1, got {value!r}."
            )
    if loss_scale is not None and not (
        isinstance(loss_scale, (int, float)) and 0 < loss_scale < math.inf
    ):
        raise InputError(
            "`loss_scale` must be a positive finite number, got "
            f"{loss_scale!r}."
        )
    policy, switched = policy_under_test(model, policy)
    scale = float(loss_scale or current_scale(model, policy))
    loss_fn = loss_function(model, loss)
    found = batches_of(data, batches, batch_size)
    if not found:
        raise InputError("`data` yielded no batches.")
    if jit_compile == "auto":
        jit_compile = _model_jit_compile(model)
    return Inputs(
        model=model,
        batches=found,
        loss_fn=loss_fn,
        scale=scale,
        policy=policy,
        switched=switched,
        fmt=FORMATS[keras.DTypePolicy(policy).compute_dtype],
        jit_compile=bool(jit_compile),
        scale_bounds=scale_bounds(model),
    )


def _model_jit_compile(model):
    """The model's `jit_compile`, without Keras's first read storing its
    resolution of "auto" on the model."""
    saved = getattr(model, "_jit_compile", None)
    try:
        return bool(getattr(model, "jit_compile", True))
    finally:
        if hasattr(model, "_jit_compile"):
            model._jit_compile = saved


def policy_under_test(model, policy):
    """`(policy name, layers to switch to it)` for the mixed pass."""
    layers = all_layers(model)
    half = [layer for layer in layers if layer.compute_dtype in MIXED_POLICY]
    if policy is None:
        if half:
            dtypes = {layer.compute_dtype for layer in half}
            dtype = "float16" if "float16" in dtypes else "bfloat16"
            return MIXED_POLICY[dtype], []
        policy = "mixed_float16"
    name = policy.name if isinstance(policy, keras.DTypePolicy) else policy
    if name not in MIXED_POLICY.values():
        raise InputError(
            f"diagnose tests a mixed policy; got policy={policy!r}. Pass "
            "'mixed_float16' or 'mixed_bfloat16', or None to test the "
            "model's own policies."
        )
    if half:  # half layers switch half type; pinned ones stay float32
        return name, half
    # A float32 model is tested as kmp.pin_float32 would leave it built
    # under the policy: outputs and softmaxes/sigmoids stay float32.
    kept = {id(layer) for layer in output_layers(model) or []}
    return name, [
        layer
        for layer in layers
        if id(layer) not in kept and not is_sensitive(layer)
    ]


def batches_of(data, batches, batch_size):
    """Up to `batches` `(x, y)` batches of NumPy values."""
    if isinstance(data, (tuple, list)) and len(data) in (2, 3):
        x, y = data[0], data[1]
        sizes = {len(a) for a in keras.tree.flatten((x, y))}
        if len(sizes) == 1 and all(
            hasattr(a, "shape") for a in keras.tree.flatten((x, y))
        ):
            (size,) = sizes
            return [
                keras.tree.map_structure(
                    lambda a, i=i: np.asarray(a[i : i + batch_size]), (x, y)
                )
                for i in range(0, size, batch_size)
            ][:batches]
    try:
        iterator = iter(data)
    except TypeError:
        raise InputError(
            "`data` must be (x, y) arrays, a tf.data.Dataset, a "
            "keras.utils.PyDataset or an iterable of (x, y) batches; got "
            f"{type(data).__name__}."
        ) from None
    found = []
    for batch in itertools.islice(iterator, batches):
        if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3):
            raise InputError(
                "Each batch must be (x, y) or (x, y, sample_weight); got "
                f"{type(batch).__name__}."
            )
        found.append(keras.tree.map_structure(np.asarray, tuple(batch[:2])))
    return found


def loss_function(model, loss):
    """The loss as `(y, y_pred) -> scalar`: one loss per model output, as
    `compile` takes them (one for all, a list, or a dict by output name;
    None entries skipped); loss weights are not applied."""
    spec = loss if loss is not None else getattr(model, "loss", None)
    if spec is None:
        raise InputError(
            "diagnose needs a loss to take gradients: compile the model "
            "with one, or pass loss=... (e.g. "
            "'sparse_categorical_crossentropy')."
        )

    def resolve(item):
        if item is None:
            return None
        item = keras.losses.get(item)
        # A bare function would compute in y_pred's dtype; Keras's compile
        # wraps it in a Loss, which computes in float32: so does diagnose.
        return item if isinstance(item, keras.losses.Loss) else _Loss(item)

    names = list(getattr(model, "output_names", None) or [])

    def by_output(structure):
        if isinstance(structure, dict):
            missing = set(names) - set(structure)
            if missing:
                raise InputError(
                    f"Missing entries for model outputs {sorted(missing)}; "
                    f"the outputs are {names}."
                )
            return [structure[name] for name in names]
        return list(keras.tree.flatten(structure))

    def total(y, y_pred):
        preds, ys = by_output(y_pred), by_output(y)
        if isinstance(spec, (list, tuple, dict)):
            losses = [resolve(item) for item in by_output(spec)]
        else:
            losses = [resolve(spec)] * len(preds)
        if not len(losses) == len(ys) == len(preds):
            raise InputError(
                f"{len(losses)} losses for {len(preds)} model outputs and "
                f"{len(ys)} targets; pass one loss per output."
            )
        terms = [
            ops.mean(fn(t, p))  # a Loss with reduction=None: batch mean
            for fn, t, p in zip(losses, ys, preds)
            if fn is not None
        ]
        return sum(terms[1:], terms[0])

    return total


class _Loss(keras.losses.Loss):
    """A loss function as a `keras.losses.Loss` (float32, batch mean)."""

    def __init__(self, fn):
        super().__init__(name=getattr(fn, "__name__", "loss"))
        self.fn = fn

    def call(self, y_true, y_pred):
        return self.fn(y_true, y_pred)


def scale_bounds(model):
    """`(min_scale, max_scale)` of the model's kmp.LossScaleOptimizer, or
    kmp's defaults (what `kmp.wrap` would give it)."""
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, LossScaleOptimizer):
        return optimizer.min_scale, optimizer.max_scale
    return ScaleRule().min_scale, ScaleRule().max_scale


def current_scale(model, policy):
    if policy == "mixed_bfloat16":
        return 1.0  # bfloat16 has float32's range: no scaling
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        if optimizer.built:
            return float(ops.convert_to_numpy(optimizer.dynamic_scale))
        return float(optimizer.initial_scale)
    return 1.0
