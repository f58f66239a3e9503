"""Token ids declared as floats: a float model input that reaches an
embedding lookup through layers that cast it to 16 bits.

keras-io's "Text classification with Transformer" declares its token ids
as `layers.Input(shape=(maxlen,))`, float32. Float32 holds every id of a
20,000-word vocabulary exactly, but under `mixed_float16` the first layer
that takes them, the example's `TokenAndPositionEmbedding`, casts its
floating inputs to float16 (Keras's `Layer.__call__` does, for every
layer with `autocast`), which holds integers exactly only up to 2048
(bfloat16: 256): id 2049 becomes 2048, and 19999 becomes 20000, past the
table (torch: an `IndexError` in `Embedding.call`; TensorFlow on a CPU:
an `InvalidArgumentError`; JAX: a row of NaN). Keras's own `Embedding`
does not cast (`autocast=False`); a layer of the user's that passes its
input to one does.

`float_ids(model)` follows each floating input of a Functional or
Sequential model through the graph (nested Functional models opened, and
layers without weights, which keep values) to the first lookup: an
`Embedding`, or a layer whose `call` passes its input to an `Embedding`
it holds (read from its source). It lists the layers on the way that
cast to 16 bits. `kmp.pin_float32` makes those layers compute in float32,
and the audit reports the inputs where they are not.
"""

import ast
import inspect
import textwrap
from typing import NamedTuple

import keras

from kmp_config.names import HALF_DTYPES

# The largest integer up to which each 16-bit dtype holds every integer:
# 2 ** (significand bits, the implicit one included).
EXACT_UP_TO = {"float16": 2**11, "bfloat16": 2**8}

# How many layers deep the search goes from an input to its lookup.
_DEEPEST = 50


class FloatIds(NamedTuple):
    """A floating model input whose values an embedding looks up.

    Attributes:
        input: The model input's name.
        lookup: The `Embedding`, or the layer that passes the input to one.
        vocabulary: The lookup's table size (the largest `input_dim`).
        casts: The layers on the way that cast the values to 16 bits,
            first to last (empty: the lookup gets them unrounded).
        dtype: The 16-bit dtype the first of them casts to, or None.
    """

    input: str
    lookup: keras.layers.Layer
    vocabulary: int
    casts: tuple
    dtype: str | None

    @property
    def rounded(self) -> bool:
        """Whether ids of this vocabulary lose exactness on the way."""
        return self.dtype is not None and (
            self.vocabulary > EXACT_UP_TO[self.dtype]
        )


def float_ids(model) -> list[FloatIds]:
    """Every floating input of `model` that reaches an embedding lookup.

    Args:
        model: A Keras model; only Functional and Sequential models have
            a graph to follow (others give `[]`).

    Returns:
        A `FloatIds` per (input, lookup) pair, in input order.
    """
    graph = _graph(model)
    if graph is None:
        return []
    found = []
    for tensor in keras.tree.flatten(graph.inputs):
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        if not keras.backend.is_float_dtype(dtype):
            continue
        start = dtype if dtype in HALF_DTYPES else None
        name = tensor._keras_history.operation.name  # the InputLayer's
        _follow(graph, tensor, (), start, (name, found, set(), {}))
    return found


def _graph(layer):
    """The Functional graph of a Functional or built Sequential model, or
    None."""
    if isinstance(layer, keras.Sequential):
        layer = getattr(layer, "_functional", None)
    if isinstance(layer, keras.Model) and hasattr(layer, "_nodes_by_depth"):
        return layer
    return None


def _consumers(graph, tensor, node_ids):
    """The nodes of `graph` that take `tensor`, with its position among
    each node's flattened inputs. `node_ids`: graph id -> the ids of its
    nodes (a model's own graph, not its uses elsewhere), filled once per
    graph."""
    history = getattr(tensor, "_keras_history", None)
    if history is None:
        return []
    if id(graph) not in node_ids:
        nodes = graph._nodes_by_depth.values()
        node_ids[id(graph)] = {id(n) for ns in nodes for n in ns}
    nodes = node_ids[id(graph)]
    found = []
    for node in history.operation._outbound_nodes:
        if id(node) not in nodes:
            continue
        for position, argument in enumerate(node.input_tensors):
            if argument is tensor:
                found.append((node, position))
    return found


def _casts(layer):
    """Whether `layer` casts its floating inputs to 16 bits."""
    return (
        isinstance(layer, keras.layers.Layer)
        and layer.autocast
        and getattr(layer, "_convert_input_args", True)
        and layer.compute_dtype in HALF_DTYPES
    )


def _follow(graph, tensor, casts, dtype, walk, depth=0):
    """Follows `tensor` to the lookups that take it, through the layers
    that keep its values. `casts` and `dtype`: the 16-bit casts on the
    way so far; `walk`: `(input name, found, tensors seen, node ids)`."""
    name, found, seen, node_ids = walk
    if depth > _DEEPEST or id(tensor) in seen:
        return
    seen.add(id(tensor))
    for node, position in _consumers(graph, tensor, node_ids):
        layer = node.operation
        here = casts + (layer,) if _casts(layer) else casts
        cast_to = dtype or (layer.compute_dtype if here != casts else None)
        if isinstance(layer, keras.layers.Embedding):
            found.append(FloatIds(name, layer, layer.input_dim, here, cast_to))
        elif (inner_graph := _graph(layer)) is not None:
            inner = keras.tree.flatten(inner_graph.inputs)[position]
            if keras.backend.is_float_dtype(inner.dtype):
                _follow(inner_graph, inner, casts, dtype, walk, depth + 1)
        elif tables := _embeddings_fed(layer):
            vocabulary = max(table.input_dim for table in tables)
            found.append(FloatIds(name, layer, vocabulary, here, cast_to))
        elif not isinstance(layer, keras.layers.Layer) or not layer.weights:
            for output in node.outputs:
                if keras.backend.is_float_dtype(output.dtype):
                    _follow(graph, output, here, cast_to, walk, depth + 1)


def _embeddings_fed(layer) -> list:
    """The `Embedding`s a layer holds and passes the first argument of
    its `call` to, read from the source (`[]` where there is none to
    read): `self.token_emb(x)` in keras-io's `TokenAndPositionEmbedding`,
    `self.token_embedding(inputs)` in KerasHub's."""
    if not isinstance(layer, keras.layers.Layer) or not any(
        isinstance(sub, keras.layers.Embedding)
        for sub in layer._flatten_layers(include_self=False, recursive=False)
    ):
        return []
    try:
        source = textwrap.dedent(inspect.getsource(type(layer).call))
        function = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return []
    parameters = [a.arg for a in function.args.args[1:2]]
    if not parameters:
        return []
    fed = []
    for node in ast.walk(function):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
        ):
            continue
        table = getattr(layer, node.func.attr, None)
        passed = {
            n.id
            for argument in node.args
            for n in ast.walk(argument)
            if isinstance(n, ast.Name)
        }
        if isinstance(table, keras.layers.Embedding) and (
            parameters[0] in passed
        ):
            fed.append(table)
    return fed
