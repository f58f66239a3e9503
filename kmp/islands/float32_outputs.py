"""A model output that a layer of layers produces, in float32.

`kmp.pin_float32` gives each layer that produces a model output a
float32 policy. A layer with layers of its own is not made float32 by
its own policy: Keras casts its inputs to float32, but the layers it
built keep their 16-bit policies, so its own arithmetic mixes float32
with their float16 and its output may stay float16. keras-io's
miniature GPT returns its Transformer block's output beside the logits
(`keras.Model(inputs, [logits, x])`); pinned by its policy alone, the
block's `inputs + attention_output` fails on TensorFlow ("Input 'y' of
'AddV2' Op has type float16 that does not match type float32 of argument
'x'"); a `MultiHeadAttention` at the output returns its output
projection's float16 on every backend. Pinning the layers inside too
would run the whole block in float32, for its output's dtype alone.

An output that another layer of the model takes is an inner layer as
well: keras-io's neural style transfer returns every layer of VGG19,
which pinned by their policies computed the whole network in float32.
So `kmp.pin_float32` casts such an output's tensors (`casts_output`),
unless the layer ends in a softmax, log-softmax or sigmoid, and decides
a layer that holds layers by what it holds (`pins_whole`):

- one with a softmax, log-softmax or sigmoid in it (an attention's own
  softmax aside), or as its own activation (a classifier head of one's own,
  `TimeDistributed(Dense(..., activation="softmax"))`) computes in
  float32 whole, its layers included: its probabilities must be computed
  in float32 for crossentropy (BUILD_NOTES, defect 8), and a head is
  small;
- any other (a block, an attention, a `Bidirectional` LSTM) keeps its
  policy and its layers theirs, and returns its outputs cast to float32
  (`return_float32`), a Keras mask on them kept. So does a nested
  subclassed model, whatever it holds: pinning a whole model to float32
  would undo mixed precision. One that ends in a softmax then computes
  it in 16 bits, and `kmp.audit` says so (pin its last layer with
  `also=`).

`return_float32` is an instance-level `call`, as `kmp.islands.gelu`
wraps one: how the layer runs, not what it is. A `.keras` file does not
keep it (nor does `copy.deepcopy`, a pickle or `keras.models.clone_model`:
call `kmp.pin_float32` on the copy). `kmp.load_model` applies it again
when it pins the loaded model, which it does where the file shows the
model was pinned (`pin_mark`: a model whose every output is such a
layer's shows it by the mark alone). Deleting the instance's `call`
(`del layer.call`) undoes it.
"""

import functools

import keras
from keras import ops

from kmp import backend
from kmp.model_layers import nested_layers

_FEATURE = "kmp.pin_float32's float32 outputs"

# Activations whose float16 results lose what crossentropy needs.
SENSITIVE_ACTIVATIONS = ("softmax", "log_softmax", "sigmoid")


def activation_name(layer):
    """The layer's activation (`"softmax"` for a Softmax layer), or None."""
    if isinstance(layer, keras.layers.Softmax):
        return "softmax"
    return getattr(getattr(layer, "activation", None), "__name__", None)


def is_sensitive(layer):
    """Whether the layer ends in a softmax, log-softmax or sigmoid."""
    return activation_name(layer) in SENSITIVE_ACTIVATIONS


def returns_float32(layer) -> bool:
    """Whether `layer` runs `return_float32`'s call."""
    return getattr(vars(layer).get("call"), "_kmp_returns_float32", False)


def _to_float32(value):
    if value is None or not hasattr(value, "dtype"):
        return value
    dtype = keras.backend.standardize_dtype(value.dtype)
    if dtype not in ("float16", "bfloat16"):
        return value
    cast = ops.cast(value, "float32")
    # A mask the layer's layers put on its output (a LayerNormalization's
    # passes its input's on) goes on with it: the loss reads it there.
    get_keras_mask, set_keras_mask = _mask_functions()
    mask = get_keras_mask(value)
    if mask is not None:
        set_keras_mask(cast, mask)
    return cast


@functools.cache
def _mask_functions():
    # Found once: eager torch runs the cast at every step. From the
    # module that defines them: Keras 3.16 no longer exports them from
    # `keras.src.backend`, where 3.15 did.
    return (
        backend.private_import(
            "keras.src.backend.common.masking", "get_keras_mask", _FEATURE
        ),
        backend.private_import(
            "keras.src.backend.common.masking", "set_keras_mask", _FEATURE
        ),
    )


def return_float32(layer) -> None:
    """Makes `layer` return its 16-bit float outputs cast to float32; its
    computation and its layers' are left as they are."""
    if returns_float32(layer):
        return
    # The class's call, whatever the class is when the layer runs
    # (pinning swaps an attention's), unless the instance had its own.
    # The layer it runs on is the one running, an NNX transform's copy
    # too (`kmp.backend.layer_call`), not this one.
    own = vars(layer).get("call")
    # With the bound call's signature, and the marks of kmp's wrappers
    # in `own` (`attends_causally`): pinning applies this one last.
    call = backend.layer_call(layer, _call_returning_float32, own)
    call._kmp_returns_float32 = True
    layer.call = call


def _call_returning_float32(layer, own, *args, **kwargs):
    if own is not None:
        outputs = own(*args, **kwargs)
    else:
        outputs = type(layer).call(layer, *args, **kwargs)
    return keras.tree.map_structure(_to_float32, outputs)


def pins_whole(layer) -> bool:
    """Whether an output layer that holds layers computes in float32
    whole, its layers included (the module's docstring says when); if
    not, it gets `return_float32`."""
    return not isinstance(layer, keras.Model) and holds_probabilities(layer)


def casts_output(layer, fed) -> bool:
    """Whether `kmp.pin_float32` casts an output layer's outputs to
    float32 (`return_float32`) rather than computing it in float32: one
    that holds layers, or that another layer of the model takes (`fed`,
    `kmp.model_layers.fed_outputs`), and holds no probabilities."""
    if isinstance(layer, keras.layers.InputLayer):
        return False
    inner = id(layer) in fed or bool(nested_layers(layer))
    return inner and not pins_whole(layer)


def holds_probabilities(layer) -> bool:
    """Whether `layer`, or a layer it holds, ends in a softmax, log-softmax
    or sigmoid. An attention's own softmax (its scores') does not count:
    Keras's `MultiHeadAttention` and `GroupedQueryAttention`, and
    KerasHub's attentions, hold it as `_softmax`."""
    if is_sensitive(layer):
        return True
    if isinstance(getattr(layer, "_softmax", None), keras.layers.Softmax):
        return False
    return any(
        holds_probabilities(inner)
        for inner in layer._flatten_layers(include_self=False, recursive=False)
    )
