"""Reading and changing a model's layers: every layer, the layers that
produce its outputs, layers picked by class or by path pattern, a
layer's class swapped in place, and the traced steps that a change
leaves behind made afresh.

`kmp.pin_float32`, `kmp.float8`, the audit and the doctor all walk models
this way, so that they agree on what "the model's layers" and "an output
layer" are.
"""

import re

import keras

from kmp.errors import InputError
from kmp.errors import InputTypeError


def all_layers(model):
    """The model and every layer nested in it, each once."""
    return list(model._flatten_layers(include_self=True, recursive=True))


def nested_layers(layer) -> list:
    """The layers `layer` holds, at any depth (itself not included): a
    block's, an attention's projections, a wrapper's layer."""
    return list(layer._flatten_layers(include_self=False, recursive=True))


def output_layers(model):
    """The layers whose outputs are `model`'s outputs, nested models opened.

    Returns `None` for a subclassed model, whose outputs are not recorded.
    """
    if isinstance(model, keras.Sequential) and not model.built:
        return [model.layers[-1]] if model.layers else []
    outputs = getattr(model, "outputs", None)
    if not outputs:
        return None
    found = []
    for tensor in keras.tree.flatten(outputs):
        layer = tensor._keras_history.operation
        if not isinstance(layer, keras.layers.Layer):
            # A bare op (e.g. keras.ops.softmax in a Functional model) has
            # no policy to set; kmp.audit reports such outputs.
            continue
        if isinstance(layer, keras.Model):
            inner = output_layers(layer)
            found.extend(inner if inner is not None else [layer])
        else:
            found.append(layer)
    return found


def has_own_call(model) -> bool:
    """Whether `model` is a Keras model with a `call` of its own (not a
    trainer of the models it holds, `held_models`)."""
    return (
        isinstance(model, keras.Model)
        and type(model).call is not keras.Model.call
    )


def held_models(model) -> list:
    """`(name, model)` for each model with recorded outputs that `model`
    holds (by the held model's name), where `model` trains them and has
    no `call` of its own: keras-io's VAE (`encoder`, `decoder`) and GANs
    (`discriminator`, `generator`), whose train step's loss reads their
    outputs. Empty for any other model."""
    if not isinstance(model, keras.Model) or has_own_call(model):
        return []
    if output_layers(model) is not None:
        return []
    # Its layers, not `vars(model)`: on torch a layer is a torch module,
    # which keeps its modules out of the instance's `__dict__`.
    return [
        (inner.name, inner)
        for inner in model._flatten_layers(include_self=False, recursive=False)
        if isinstance(inner, keras.Model) and output_layers(inner) is not None
    ]


def fed_outputs(model) -> set:
    """The ids of the layers that make an output of `model` which another
    of its layers takes too (a feature extractor returns every layer's
    output, keras-io's style transfer; a transformer block returned
    beside the logits), nested models opened; read back from its
    recorded outputs. A layer called twice counts by the call that makes
    the output (KerasHub's tied embedding looks tokens up first, and
    makes the logits, which nothing takes, last). Empty for a model with
    no recorded outputs (a subclassed one)."""
    outputs = keras.tree.flatten(getattr(model, "outputs", None) or [])
    taken = set()  # (operation id, node index, tensor index) a node takes
    nested = []
    seen = set()
    stack = list(outputs)
    while stack:
        history = getattr(stack.pop(), "_keras_history", None)
        if history is None:
            continue
        operation = history.operation
        if (id(operation), history.node_index) in seen:
            continue
        seen.add((id(operation), history.node_index))
        if isinstance(operation, keras.Model):
            nested.append(operation)
        node = operation._inbound_nodes[history.node_index]
        for tensor in keras.tree.flatten(node.input_tensors):
            inner = getattr(tensor, "_keras_history", None)
            if inner is not None:
                taken.add(_made_by(inner))
                stack.append(tensor)
    fed = {
        id(_maker(tensor))
        for tensor in outputs
        if _made_by(tensor._keras_history) in taken
    }
    for inner in nested:
        fed |= fed_outputs(inner)
    return fed


def output_feeders(model) -> list:
    """`(layer, output layer)` for each layer that makes a tensor an
    output layer of `model` (`output_layers`) takes, nested models
    opened: the classifier a loss layer reads (keras-io's captcha OCR's
    `Dense(softmax)` before its `CTCLayer`). Inputs are no layers here.
    Empty for a model with no recorded outputs."""
    if isinstance(model, keras.Sequential) and not model.built:
        return list(zip(model.layers[-2:-1], model.layers[-1:]))
    found = {}
    for tensor in keras.tree.flatten(getattr(model, "outputs", None) or []):
        history = _opened(tensor._keras_history)
        output = history.operation
        node = output._inbound_nodes[history.node_index]
        for taken in keras.tree.flatten(node.input_tensors):
            if getattr(taken, "_keras_history", None) is None:
                continue
            layer = _maker(taken)
            if isinstance(layer, keras.layers.Layer) and not isinstance(
                layer, keras.layers.InputLayer
            ):
                found[id(layer), id(output)] = (layer, output)
    return list(found.values())


def _made_by(history):
    return id(history.operation), history.node_index, history.tensor_index


def _maker(tensor):
    """The layer that makes `tensor`, a nested model's opened."""
    return _opened(tensor._keras_history).operation


def _opened(history):
    """`history`, or where a nested model with recorded outputs makes
    its tensor, to any depth (a subclassed model is a layer here)."""
    while isinstance(history.operation, keras.Model):
        outputs = getattr(history.operation, "outputs", None)
        if not outputs:
            break
        history = keras.tree.flatten(outputs)[history.tensor_index]
        history = history._keras_history
    return history


def check_patterns(patterns, argument="also") -> tuple:
    """`patterns` as a tuple, each checked: a layer class, or a regular
    expression matched against layer paths or names (`matches`).

    Args:
        patterns: An iterable of classes and strings.
        argument: The caller's argument name, for the error message.
    """
    patterns = tuple(patterns)
    for pattern in patterns:
        if isinstance(pattern, type) and issubclass(
            pattern, keras.layers.Layer
        ):
            continue
        if isinstance(pattern, str):
            try:
                re.compile(pattern)
            except re.error as error:
                raise InputError(
                    f"`{argument}` entry {pattern!r} is not a valid regular "
                    f"expression ({error})."
                ) from None
            continue
        raise InputError(
            f"`{argument}` takes layer classes and regular expressions "
            f"matched against layer paths or names, got {pattern!r}."
        )
    return patterns


def matches(layer, patterns) -> bool:
    """Whether `layer` is an instance of a class in `patterns`, or its
    `path` or `name` fully matches a regular expression there."""
    for pattern in patterns:
        if isinstance(pattern, type):
            if isinstance(layer, pattern):
                return True
        elif re.fullmatch(pattern, layer.path or "") or re.fullmatch(
            pattern, layer.name
        ):
            return True
    return False


def retrace_steps(model) -> None:
    """Makes a model's `fit`, `evaluate` and `predict` steps afresh, which
    Keras makes once and reuses (on JAX and TensorFlow they run the
    program traced from the layers as they were): each traces again at
    its next call, with the layers as they are now. Made, not dropped:
    `fit` calls `model.train_function` at each step, so a callback that
    changes the model while it runs (`on_epoch_end`) would leave it
    `None` for the next one."""
    if not isinstance(model, keras.Model):
        return
    for made, make in (
        (model.train_function, model.make_train_function),
        (model.test_function, model.make_test_function),
        (model.predict_function, model.make_predict_function),
    ):
        if made is not None:
            make(force=True)


def swap_class(layer, cls):
    """Turns `layer` into an instance of `cls`, a kmp subclass of its class.

    The layer keeps its identity, weights, config and build state; only
    the `call` that `cls` overrides changes. Used on exact Keras classes
    only, so no user subclass's behaviour is lost.

    A mixin of `cls` (kmp's `_Float32Compute`, `_Float8`) derives from
    `keras.layers.Layer`: a plain one first among the bases lays out
    `cls`'s instances from itself, not from Keras's root class, which
    Python accepts only where that root is `object` (under NNX it is
    Flax's `Pytree`: "object layout differs").
    """
    if not issubclass(cls, type(layer)):
        raise InputTypeError(
            f"{cls.__name__} is not a subclass of {type(layer).__name__}."
        )
    layer.__class__ = cls
    # What the layer built as its old class may need the new class's
    # touch (kmp's MultiHeadAttention: the softmax the stock one made).
    after_swap = getattr(layer, "after_swap_class", None)
    if after_swap is not None and layer.built:
        after_swap()
