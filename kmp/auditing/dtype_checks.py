"""The audit's checks of where the user's own code meets a 16-bit
policy's dtypes: token ids declared as floats that reach an embedding
through a 16-bit cast, a layer's `call` that draws float32 random values
into its 16-bit computation, and a `train_step` that joins a sub-model's
16-bit output with its float32 data in a TensorFlow op, which does not
promote.

The last two fail on TensorFlow with a dtype error from deep inside it
(kmp adds a line naming the layer: `kmp.dtype_errors`); the audit finds
them before the run, where it can read the code (`source_reading`).
Each `check_*` appends `(severity, where, problem, fix)` tuples to
`findings`, as in `model_checks`.
"""

import ast

import keras

from kmp import backend
from kmp.auditing import source_reading
from kmp.auditing.model_checks import _path
from kmp.islands import EXACT_UP_TO
from kmp.islands import float_ids
from kmp.model_layers import output_layers
from kmp_config.names import HALF_DTYPES

# Keras's and TensorFlow's random draws of floats (float32 unless told),
# by the package their module comes from, and where their `dtype`
# argument sits when passed by position.
_DTYPE_POSITION = {
    "keras": {
        "normal": 3,
        "uniform": 3,
        "truncated_normal": 3,
        "gamma": 2,
        "beta": 3,
        "binomial": 3,
        "random_normal": 3,  # tf.keras.backend's
        "random_uniform": 3,
    },
    "tensorflow": {
        "normal": 3,
        "uniform": 3,
        "truncated_normal": 3,
        "gamma": 3,
    },
}

# TensorFlow's ops that take a list and do not promote its dtypes, and
# Keras's that do.
_LIST_OPS = {
    "tf.concat": "keras.ops.concatenate",
    "tf.stack": "keras.ops.stack",
}


def check_float_ids(model, findings):
    """Token ids in a float input that a 16-bit cast rounds before an
    embedding looks them up (`kmp.islands.float_ids`)."""
    for ids in float_ids(model):
        if not ids.rounded:
            continue
        lookup = ids.lookup
        exact = EXACT_UP_TO[ids.dtype]
        last = ids.vocabulary - 1
        rounded = _round(last, ids.dtype)
        fate = f"the last id, {last}, becomes {rounded}" + (
            ", past the table (an IndexError on torch, an error on "
            "TensorFlow on a CPU, a row of NaN on JAX)"
            if rounded >= ids.vocabulary
            else ""
        )
        caster = ids.casts[0] if ids.casts else None
        by = f" (cast by '{caster.name}')" if caster is not None else ""
        pins = ", ".join(f"'{layer.name}'" for layer in ids.casts)
        findings.append(
            (
                "error",
                _path(lookup),
                f"Token ids from the float input '{ids.input}' reach "
                f"{type(lookup).__name__} '{lookup.name}' as "
                f"{ids.dtype}{by}, which holds integers exactly only up "
                f"to {exact}: in this table of {ids.vocabulary} rows, ids "
                f"above {exact} read their neighbours' rows, and {fate}.",
                "Declare the ids as integers: keras.Input(..., "
                "dtype='int32')"
                + (
                    f"; or kmp.pin_float32(model), which keeps {pins} in "
                    "float32."
                    if pins
                    else "."
                ),
            )
        )


def _round(value, dtype) -> int:
    half = keras.ops.cast(keras.ops.convert_to_tensor(value, "float32"), dtype)
    return int(keras.ops.convert_to_numpy(keras.ops.cast(half, "float32")))


def _draws_without_dtype(method):
    """`module.function` of each of Keras's or TensorFlow's random draws
    of floats in a method that passes no `dtype`."""
    found = []
    for node, name, package, function in source_reading.module_calls(method):
        positions = _DTYPE_POSITION.get(package, {})
        if function not in positions:
            continue
        # `**kwargs` may hold a dtype: not read, not reported.
        by_keyword = any(k.arg in ("dtype", None) for k in node.keywords)
        by_position = len(node.args) > positions[function]
        if not (by_keyword or by_position or _cast(method.tree, node)):
            found.append(name)
    return found


def _cast(tree, draw) -> bool:
    """Whether the method, after the draw, casts it or a name it flows
    into through assignments after it (keras-io's SimCLR: draws made a
    colour matrix, which the fix casts), with a `cast(...)`. A cast
    before the draw (the input's, say) does not count. The first clash
    may still come before the cast: then kmp's line at run time names
    it."""
    flowing = set()

    def after(node):
        return (node.end_lineno, node.end_col_offset) >= (
            draw.end_lineno,
            draw.end_col_offset,
        )

    def carries(expression):
        return any(
            node is draw or (isinstance(node, ast.Name) and node.id in flowing)
            for node in ast.walk(expression)
        )

    assignments = [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        and node.value is not None
        and after(node)
    ]
    grown = True
    while grown:  # names made from names made from the draw
        before = len(flowing)
        for node in assignments:
            if carries(node.value):
                targets = getattr(node, "targets", None) or [node.target]
                flowing.update(
                    name.id
                    for target in targets
                    for name in ast.walk(target)
                    if isinstance(name, ast.Name)
                )
        grown = len(flowing) > before
    return any(
        isinstance(node, ast.Call)
        and source_reading.dotted(node.func).rpartition(".")[2] == "cast"
        and node.args
        and carries(node.args[0])
        and after(node)
        for node in ast.walk(tree)
    )


def check_random_draws(half, findings):
    """A 16-bit layer of the user's whose `call` draws float32 random
    values (no `dtype=`): TensorFlow refuses to mix them with the
    layer's 16-bit tensors (keras-io's VAE `Sampling`)."""
    found = source_reading.first_in_calls(half, _draws_without_dtype)
    for layer, method, draw in found:
        cls = type(layer)
        findings.append(
            (
                "warning",
                _path(layer),
                f"{method.where} draws {draw}(...) without dtype=: the "
                f"draw is float32 while {cls.__name__} computes in "
                f"{layer.compute_dtype}; TensorFlow raises a TypeError "
                "where they meet (JAX and torch promote the result to "
                "float32).",
                f"{draw}(..., dtype=self.compute_dtype), or cast the draw "
                "(keras.ops.cast(x, self.compute_dtype)); or run the layer "
                f"in float32: {cls.__name__}(..., dtype='float32'), or "
                # The class: the finding is said once for all its layers.
                f"kmp.pin_float32(model, also=[{cls.__name__}]).",
            )
        )


def _half_dtype(value) -> str | None:
    """The 16-bit dtype of a sub-model's or layer's outputs (a model:
    its output layers', which `kmp.pin_float32` may have changed since
    it was built), or None."""
    if isinstance(value, keras.Model):
        layers = output_layers(value)
        if layers:
            dtypes = [layer.compute_dtype for layer in layers]
            return next((d for d in dtypes if d in HALF_DTYPES), None)
    if isinstance(value, keras.layers.Layer):
        if value.compute_dtype in HALF_DTYPES:
            return value.compute_dtype
    return None


def _half_output(value) -> bool:
    return _half_dtype(value) is not None


def _data_names(tree):
    """The step's data argument (the last one: `data`, or JAX's
    `(state, data)`) and the names unpacked or indexed from it."""
    arguments = [a.arg for a in tree.args.args[1:]]
    names = set(arguments[-1:])
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        value = node.value
        if isinstance(value, ast.Subscript):
            value = value.value
        if isinstance(value, ast.Name) and value.id in names:
            for target in node.targets:
                names.update(
                    n.id for n in ast.walk(target) if isinstance(n, ast.Name)
                )
    return names


def _outputs_named(tree, model):
    """`name -> attribute` for `name = self.attribute(...)` in the tree,
    where `self.attribute` gives 16-bit outputs."""
    named = {}
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            continue
        attribute = _self_attribute(node.value.func)
        if attribute and _half_output(getattr(model, attribute, None)):
            named[node.targets[0].id] = attribute
    return named


def _self_attribute(node):
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return node.attr
    return None


def check_step_joins(model, findings):
    """A `train_step` of the user's that joins a sub-model's 16-bit
    output with its float32 data in a TensorFlow list op (`tf.concat`),
    which does not promote (keras-io's DCGAN, as its `.py` writes it)."""
    cls = type(model)
    if cls.train_step is keras.Model.train_step:
        return
    steps, _ = source_reading.reachable(cls, "train_step")
    if (
        not steps
        or steps[0].tree is None
        or not backend.is_users(steps[0].owner)
    ):
        return
    data = _data_names(steps[0].tree)
    for method in steps:
        if method.tree is None:
            continue
        outputs = _outputs_named(method.tree, model)
        for node in ast.walk(method.tree):
            if not (
                isinstance(node, ast.Call)
                and source_reading.dotted(node.func) in _LIST_OPS
                and node.args
                and isinstance(node.args[0], (ast.List, ast.Tuple))
            ):
                continue
            elements = node.args[0].elts
            half = [
                outputs.get(e.id) or _self_attribute(e.func)
                for e in elements
                if (isinstance(e, ast.Name) and e.id in outputs)
                or (
                    isinstance(e, ast.Call)
                    and _half_output(
                        getattr(model, _self_attribute(e.func) or "", None)
                    )
                )
            ]
            joined = [
                e.id
                for e in elements
                if isinstance(e, ast.Name) and e.id in data - set(outputs)
            ]
            if half and joined:
                _report_join(model, method, node, half[0], joined[0], findings)


def _report_join(model, method, node, attribute, data, findings):
    op = source_reading.dotted(node.func)
    dtype = _half_dtype(getattr(model, attribute))
    findings.append(
        (
            "warning",
            "model",
            f"{method.where} joins {attribute}'s {dtype} output with the "
            f"step's data ({data}, float32) in {op}, which does not "
            "promote: TensorFlow raises a TypeError at the first step.",
            f"kmp.pin_float32(model.{attribute}), which makes its output "
            f"float32; or {_LIST_OPS[op]}, which promotes.",
        )
    )
