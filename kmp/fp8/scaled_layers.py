"""Keras's float8 `Dense` and `EinsumDense`, computed by kmp's own float8
matmul on JAX and torch (`kmp.fp8.scaled_matmul`).

`kmp.float8(model, matmul="kmp")` converts a layer as Keras does
(`layer.quantize("float8")`: the dtype policy, and with it the `.keras`
file, says float8) and then gives it one of these classes, whose
`quantized_call` runs `float8_matmul`: `dot_general` on two float8
operands scaled from their current amax, both backward matmuls on float8
too, no amax histories. What stays Keras's:

- the file: the policy and Keras's float8 variables are saved as Keras
  saves them. A Functional or Sequential model's file names these
  classes (kmp must be imported to load it); a model whose own code
  rebuilds its layers (subclassed, KerasHub's) gets Keras's float8
  layers back, and `kmp.float8(model, matmul="kmp")` puts kmp's matmul
  back in;
- the variables: Keras's scales and amax histories are kept as they
  are. They stay trainable, so that a model's trainable set (and an
  optimizer built for it) is the same with either matmul; kmp's matmul
  does not read them, and each step hands each of them its own value as
  its gradient, which Keras writes back over it (`overwrite_with_gradient`:
  a variable no step read would get a zero gradient written instead);
- the class names: `Dense` and `EinsumDense`, as Keras's, because a
  `.keras` file names a subclassed model's weights by its layers' class
  names (`layers/dense`), and a model rebuilt by its own code makes
  Keras's classes (as `kmp.islands.MultiHeadAttention` is named);
- TensorFlow, and an einsum that is not one matmul (a batch
  dimension shared by the input and the kernel): Keras's own float8 call.
"""

import string

import keras
from keras import ops

from kmp import backend
from kmp.fp8.scaled_matmul import float8_matmul
from kmp.fp8.scaled_matmul import keep_state
from kmp.model_layers import swap_class


class _ScaledFloat8(keras.layers.Layer):
    """Mixin: the float8 call of a Keras matmul layer by `float8_matmul`.
    A `Layer`, so that it can be swapped in under NNX
    (`kmp.model_layers.swap_class`)."""

    def quantized_call(self, inputs, *args, **kwargs):
        product = None
        if self.quantization_mode == "float8" and backend.name() in (
            "jax",
            "torch",
        ):
            product = self._float8_product(inputs)
        if product is None:
            return super().quantized_call(inputs, *args, **kwargs)
        product = keep_state(product, self._keras_float8_state())
        if self.bias is not None:
            product = ops.add(product, self.bias)
        if self.activation is not None:
            product = self.activation(product)
        return product

    def _keras_float8_state(self):
        return [
            variable
            for variable in self.trainable_variables
            if getattr(variable, "overwrite_with_gradient", False)
        ]


@keras.saving.register_keras_serializable(package="kmp")
class Dense(_ScaledFloat8, keras.layers.Dense):
    """Keras's float8 `Dense`, computed by kmp's float8 matmul on JAX and
    torch.

    Made by `kmp.float8(model, matmul="kmp")`; see the module docstring.
    """

    def _float8_product(self, inputs):
        return float8_matmul(inputs, self.kernel, self.compute_dtype)


@keras.saving.register_keras_serializable(package="kmp")
class EinsumDense(_ScaledFloat8, keras.layers.EinsumDense):
    """Keras's float8 `EinsumDense`, computed by kmp's float8 matmul on JAX
    and torch when its equation is one matmul (every attention projection
    is).

    Made by `kmp.float8(model, matmul="kmp")`; see the module docstring.
    """

    def _float8_product(self, inputs):
        plan = matmul_plan(self.equation, len(inputs.shape))
        if plan is None:
            return None
        x_order, kernel_order, free_ranks, output_order = plan
        x = _transpose(inputs, x_order)
        kernel = _transpose(self.kernel, kernel_order)
        free, contracted = free_ranks
        x_shape, kernel_shape = tuple(x.shape), tuple(kernel.shape)
        x = ops.reshape(x, x_shape[:free] + (-1,))
        kernel = ops.reshape(kernel, (-1, _product(kernel_shape[contracted:])))
        y = float8_matmul(x, kernel, self.compute_dtype)
        y = ops.reshape(y, x_shape[:free] + kernel_shape[contracted:])
        return _transpose(y, output_order)


def matmul_plan(equation, rank):
    """How an `EinsumDense` equation is one matmul, or `None`.

    Returns `(x_order, kernel_order, (free, contracted), output_order)`:
    the input's axes put as `[free..., contracted...]`, the kernel's as
    `[contracted..., kernel_free...]` (the same contracted order), the
    number of the input's free axes and of the contracted ones, and the
    permutation from `[free..., kernel_free...]` to the equation's
    output. `None` when a letter is shared by all three (a batch
    dimension) or summed over one operand alone.
    """
    inputs, rest = equation.split(",")
    kernel, output = rest.split("->")
    if "..." in inputs:
        spare = [c for c in string.ascii_letters if c not in equation]
        filled = "".join(spare[: rank - (len(inputs) - 3)])
        inputs = inputs.replace("...", filled)
        output = output.replace("...", filled)
    if len(inputs) != rank or "..." in kernel:
        return None
    contracted = [c for c in kernel if c in inputs and c not in output]
    free = [c for c in inputs if c not in contracted]
    kernel_free = [c for c in kernel if c not in contracted]
    if set(free) & set(kernel) or sorted(free + kernel_free) != sorted(output):
        return None
    product = free + kernel_free
    return (
        [inputs.index(c) for c in free + contracted],
        [kernel.index(c) for c in contracted + kernel_free],
        (len(free), len(contracted)),
        [product.index(c) for c in output],
    )


def use_kmp_matmul(layer):
    """Gives a float8 Keras `Dense` or `EinsumDense` kmp's matmul, in
    place; returns it. Other layers are returned unchanged."""
    for keras_class, kmp_class in _CLASSES.items():
        if type(layer) is keras_class:
            swap_class(layer, kmp_class)
    return layer


def _transpose(x, order):
    if order == sorted(order):
        return x  # an identity permutation: no copy
    return ops.transpose(x, order)


def _product(sizes):
    total = 1
    for size in sizes:
        total *= size
    return total


_CLASSES = {keras.layers.Dense: Dense, keras.layers.EinsumDense: EinsumDense}
SCALED_CLASSES = tuple(_CLASSES.values())
