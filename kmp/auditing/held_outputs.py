"""Which outputs of a held model a value of a trainer's step carries: all
of them, or one told apart by unpacking or a constant subscript.

A GAN's combined model may return the discriminator's score and the
generator's images (`Model(z, [validity, images])`); its trainer applies
a crossentropy to the score alone:

    validity, images = self.combined(z)   # or out = self.combined(z)
    loss = self.loss_fn(y, validity)      # loss = self.loss_fn(y, out[0])

`loss_flow` follows what each name of the step carries; this module
says what a part of a held model's call result is. A call carries
`Outputs(model, None)`, the structure the model returns (its
`model.output`: a list, a tuple or a dict of outputs). Its `[0]`,
`[-1]` or `["validity"]`, or the first of as many names as it has
outputs, carries `Outputs(model, 0)` (or `-1` made `1`, or
`"validity"`): that output alone. Anything else carries every output,
said by the model's name alone: a key the structure lacks, an index
that is no constant (`out[i]`), a slice, a starred name, a dict
unpacked (that gives its keys), a model of one output, a
`stateless_call` (it returns the outputs and the variables), a value a
function or an operator made of the structure (`ops.stack(out)[0]`).

`trainer_losses` then reports a crossentropy on one output by `output_key`,
`"combined/validity"`, the held model's name and the path of each layer
that makes that output (every output layer of a nested model that makes
it), and a crossentropy on every output by the model's name;
`output_losses` gives the audit the losses of one output layer.
"""

import ast
from typing import NamedTuple

import keras

from kmp import model_layers


class Outputs(NamedTuple):
    """What a held model's call result carries.

    Attributes:
        model: The held model's name.
        key: None for the structure the model returns, or the index or
            dict key of the one output it carries (an index not
            negative).
    """

    model: str
    key: int | str | None


def constant(node):
    """The key a subscript's slice is where it is a constant: an int
    (`0`, `-1`) or a str; None for anything else (`i`, `1:`, `True`)."""
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        sign, node = -1, node.operand
    if not isinstance(node, ast.Constant) or isinstance(node.value, bool):
        return None
    if isinstance(node.value, int):
        return sign * node.value
    if isinstance(node.value, str) and sign == 1:
        return node.value
    return None


def _structure(model):
    """A model's output structure (`model.output`), None where reading
    it raises (a model never called)."""
    try:
        return model.output
    except Exception:
        return None


def _index(structure, key, count):
    """The key of one output of `structure` that `key` names (negative
    indices made positive), where `count` names unpack it into as many;
    None where `key` names no single output."""
    if isinstance(structure, dict):
        # Unpacked, a dict gives its keys: no output.
        return key if count is None and key in structure else None
    if not isinstance(structure, (list, tuple)) or len(structure) < 2:
        # One output (Keras returns the tensor itself): `[0]` is a row.
        return None
    if not isinstance(key, int) or not -len(structure) <= key < len(structure):
        return None
    if count is not None and count != len(structure):
        return None
    return key % len(structure)


def part(carried, key, models, count=None) -> frozenset:
    """What `value[key]` carries, or the `key`th of `count` names that
    unpack `value` (`count` None for a subscript), where `value` carries
    `carried`. `models` maps each held model's name to the model; `key`
    None (a starred target) or not `constant` gives every output."""
    found = set()
    for each in carried:
        if not isinstance(each, Outputs) or each.key is not None:
            found.add(each)  # one output's row, or every output already
            continue
        index = None
        if key is not None:
            index = _index(_structure(models[each.model]), key, count)
        found.add(each.model if index is None else each._replace(key=index))
    return frozenset(found)


def widened(carried) -> frozenset:
    """What a value made of `carried` carries (a function's result, a
    sum): a model's structure becomes every output; one output stays."""
    return frozenset(
        each.model if isinstance(each, Outputs) and each.key is None else each
        for each in carried
    )


def output_key(name, layer) -> str:
    """`trainer_losses`'s key for the output `layer` of the held model
    `name`: `"combined/validity"`."""
    return f"{name}/{layer.path or layer.name}"


def result_keys(each, models) -> list:
    """`trainer_losses`'s keys for what a crossentropy's prediction
    carries: the held model's name for every output, or `output_key`
    for each layer that makes the one output (the name where no layer
    makes it: an op's output)."""
    if not isinstance(each, Outputs):
        return [each]
    if each.key is None:
        return [each.model]
    model = models[each.model]
    tensors = keras.tree.flatten(_structure(model)[each.key])
    layers = []
    for tensor in tensors:
        layer = tensor._keras_history.operation
        if isinstance(layer, keras.Model):
            layers += model_layers.output_layers(layer) or [layer]
        elif isinstance(layer, keras.layers.Layer):
            layers.append(layer)
    if len(layers) < len(tensors):
        return [each.model]
    return [output_key(each.model, layer) for layer in layers]


def output_losses(losses, name, layer) -> list:
    """The crossentropies that read the output `layer` of the held model
    `name`, from `trainer_losses`'s `losses`: those that read all its
    outputs, then those that read this one."""
    found = list(losses.get(name, []))
    for loss in losses.get(output_key(name, layer), []):
        if loss not in found:
            found.append(loss)
    return found
