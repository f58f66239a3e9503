"""Keras's `Normalization` layer in float32 under kmp's 16-bit policies.

`keras.layers.Normalization` standardizes raw features: `(x - mean) /
sqrt(variance)`. Under a 16-bit policy Keras computes it in 16 bits, and
Keras's own mixed precision says nothing of what that costs:

- its mean and variance are cast to the compute dtype (`finalize_state`,
  `build`): a feature whose variance is over 65504, float16's largest
  value (a standard deviation over 256: prices, populations, counts),
  gets an infinite variance, and the layer outputs 0 for it, every row,
  on every backend (keras-io's `FeatureSpace` with `"float_normalized"`
  included);
- its input is cast to the compute dtype before the subtraction: a value
  over 65504 is infinite in float16, and bfloat16 keeps 8 significant
  bits (a year of 2003 reads 2000 or 2008, up to 0.4 of a standard
  deviation of 10);
- `adapt` over a dataset converts each batch to the compute dtype: its
  statistics come from 16-bit batches on JAX and torch, and TensorFlow
  refuses to add them to Keras's float32 sums.

The arithmetic is a subtraction and a division per feature, no matmul:
16 bits buy it nothing. So while a 16-bit kmp policy is in force
(`kmp.enable`, `kmp.policy_scope`) a `Normalization` computes in float32:
one made then builds in float32 (given its `mean` and `variance` or
adapted), and `adapt` puts one made before in float32 before it reads
the data (kmp wraps Keras's two methods on the switch of kmp's error
lines, `kmp.backend.while_16_bit`, which `kmp.disable` turns off); and
`kmp.pin_float32` puts every one of a model in float32, its statistics
made again (`normalize_in_float32`). Its output is float32; the next
layer casts it to its own compute dtype, which a standardized feature
survives. The layer's `dtype_policy` says `"float32"`, which a `.keras`
file keeps.

Keras's `Rescaling` (`x * scale + offset`) reads raw values too, and
casts its input to the compute dtype before it multiplies: a 16-bit
image's 65535 (`Rescaling(1 / 65535)`) is infinite in float16, and the
step's loss NaN from the first batch that holds one; bfloat16 keeps 8
significant bits of it, an 8-bit image's worth. One multiply and add per
value: `kmp.pin_float32` makes each one that reads raw values compute
in float32 (`reads_raw_values`, `rescale_in_float32`), its output
float32 for the next layer to cast. One that scales a 16-bit layer's
output (ResNet-9's logits by 0.125) keeps its policy: its input has
been in 16 bits already; so does one of an 8-bit image, every value of
which both 16-bit dtypes hold.

Keras's `STFTSpectrogram`, which reads raw audio, refuses a bfloat16
input outright: under `mixed_bfloat16` `kmp.pin_float32` makes it
compute in float32 (`is_bfloat16_spectrogram`); float16 it takes.
"""

import functools

import keras
import numpy as np

from kmp import backend
from kmp.layer_policies import pin_to_float32
from kmp_config.names import HALF_DTYPES


def is_feature_normalization(layer) -> bool:
    """Whether `layer` is a Keras `Normalization` (a subclass included)."""
    return isinstance(layer, keras.layers.Normalization)


def normalize_in_float32(layer) -> bool:
    """Makes a `Normalization` compute in float32, its statistics
    included; returns whether it changed anything.

    An unbuilt layer gets Keras's `"float32"` policy, so its statistics'
    variables are float32 when it builds. A built one keeps its
    variables' dtype (`kmp.layer_policies.pin_to_float32`: float32, or
    bfloat16 under bfloat16 master weights, whose statistics were rounded
    when stored), and its mean and variance tensors, cast to its compute
    dtype when it built, are made again in float32: from its variables
    for an adapted layer (Keras's `finalize_state`), from the `mean` and
    `variance` it was given otherwise (Keras's `build`, which adds no
    variable then).

    Args:
        layer: A `keras.layers.Normalization`.
    """
    if not layer.built:
        if layer.compute_dtype not in HALF_DTYPES:
            return False
        layer.dtype_policy = keras.DTypePolicy("float32")
        return True
    if layer.compute_dtype in HALF_DTYPES:
        pin_to_float32(layer)
    elif keras.backend.standardize_dtype(layer.mean.dtype) == "float32":
        return False
    if layer.input_mean is None:
        layer.finalize_state()
    else:
        # The class's `build`, not the instance's: the wrapper
        # `Layer.__new__` puts on the instance would also reset the
        # layer's path to the scope it is called from, which a model's
        # policy map looks layers up by. (While kmp's policy is on the
        # class's is kmp's wrapper, which passes a built layer through.)
        shape = layer.get_build_config()["input_shape"]
        type(layer).build(layer, shape)
    return True


def is_rescaling(layer) -> bool:
    """Whether `layer` is a Keras `Rescaling` (a subclass included)."""
    return isinstance(layer, keras.layers.Rescaling)


# Inputs whose every value float16 and bfloat16 hold exactly (integers
# up to 256): an 8-bit image's.
_EXACT_IN_16_BITS = HALF_DTYPES + ("uint8", "int8", "bool")


def input_dtypes(layer) -> set:
    """The dtypes of the tensors `layer` is called on in a Functional or
    Sequential model's graph; empty where there is none to read (a
    subclassed model's layer)."""
    return {
        keras.backend.standardize_dtype(tensor.dtype)
        for node in layer._inbound_nodes
        for tensor in keras.tree.flatten(node.input_tensors)
    }


def reads_raw_values(layer) -> bool:
    """Whether a `Rescaling` may read raw values that 16 bits round: in
    a Functional or Sequential model, whether it is called on a tensor
    that is no 16-bit float nor 8-bit integer (a `keras.Input`'s uint16,
    int32 or float32, a float32 layer's output); with no graph to read,
    True."""
    dtypes = input_dtypes(layer)
    return not dtypes or not dtypes <= set(_EXACT_IN_16_BITS)


def rescale_in_float32(layer) -> bool:
    """Makes a `Rescaling` that computes in 16 bits and reads raw values
    compute in float32 (it holds no variable; `pin_to_float32` keeps a
    bfloat16 master weights policy's variable dtype); returns whether it
    changed it."""
    if layer.compute_dtype not in HALF_DTYPES or not reads_raw_values(layer):
        return False
    pin_to_float32(layer)
    return True


def is_bfloat16_spectrogram(layer) -> bool:
    """Whether `layer` is a Keras `STFTSpectrogram` computing in
    bfloat16, which it refuses ("Invalid input type. Expected float16,
    float32 or float64"; keras-io's speech examples read raw audio
    through one)."""
    return (
        isinstance(layer, keras.layers.STFTSpectrogram)
        and layer.compute_dtype == "bfloat16"
    )


def largest_statistic(layer) -> float | None:
    """The largest of a built `Normalization`'s variances and absolute
    means as it holds them (its variables, or the `mean` and `variance`
    it was given; `inf` or NaN if an adapt in 16 bits made them so), or
    None if it has none yet."""
    if not layer.built:
        return None
    if layer.input_mean is None:
        held = (layer.adapt_mean, layer.adapt_variance)
    else:
        held = (layer.input_mean, layer.input_variance)
    return max(
        float(np.max(np.abs(keras.ops.convert_to_numpy(value))))
        for value in held
    )


def _adapting_in_float32(adapt):
    @functools.wraps(adapt)
    def adapt_in_float32(self, *args, **kwargs):
        normalize_in_float32(self)
        return adapt(self, *args, **kwargs)

    adapt_in_float32._kmp_original = adapt
    return adapt_in_float32


def _building_in_float32(build):
    # A layer made while kmp's policy is on gets this as its `build`
    # (Keras's `Layer.__new__` wraps the class's method it finds then):
    # one given its `mean` and `variance` casts them when it builds.
    @functools.wraps(build)
    def build_in_float32(self, *args, **kwargs):
        if not self.built:
            normalize_in_float32(self)
        return build(self, *args, **kwargs)

    build_in_float32._kmp_original = build
    return build_in_float32


backend.while_16_bit(keras.layers.Normalization, "adapt", _adapting_in_float32)
backend.while_16_bit(keras.layers.Normalization, "build", _building_in_float32)
