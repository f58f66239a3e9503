"""Stage 3 of the doctor: counting what the passes observed.

Per observed layer, three families of tensors are counted against the
half format's range (`kmp.doctor.numerics.RangeCounter`): its outputs
(activations), the gradients by its outputs (activation gradients) and
the gradients by its weights (weight gradients). Each batch is counted as
soon as its passes have run, one tensor at a time on the host, so a whole
model's activations never sit in memory at once.
"""

import keras
from keras import ops

from kmp.doctor.numerics import RangeCounter

KINDS = ("activations", "activation_gradients", "weight_gradients")


def weight_owners(layers, model):
    """For each trainable variable of `model`, the index of the innermost
    observed layer owning it; `len(layers)` for the model's own (or a
    looping layer's inner) variables."""
    owner = {}
    for index, layer in enumerate(layers):  # parents come before children
        for variable in layer.trainable_variables:
            owner[id(variable)] = index
    return [owner.get(id(v), len(layers)) for v in model.trainable_variables]


class LayerCounts:
    """The counts of every observed layer, over all batches.

    Args:
        inputs: The doctor's `Inputs` (format, loss scale, model).
        layers: The observed layers.

    Attributes:
        counters: `{kind: [RangeCounter per layer]}` for each of `KINDS`,
            with one more entry at the end for weights no observed layer
            owns. Activations are counted at scale 1, gradients at the
            loss scale.
        dtypes: `{layer index: dtype of its outputs in the mixed pass}`,
            in the order the layers first ran.
        reference_dtypes: The same for the float32 pass.
    """

    def __init__(self, inputs, layers):
        self.counters = {
            kind: [
                RangeCounter(
                    inputs.fmt, 1.0 if kind == "activations" else inputs.scale
                )
                for _ in range(len(layers) + 1)
            ]
            for kind in KINDS
        }
        self.dtypes, self.reference_dtypes = {}, {}
        self._owners = weight_owners(layers, inputs.model)

    def add(self, reference, mixed):
        """Counts one batch's two `PassResult`s."""
        if reference.keys != mixed.keys:
            raise RuntimeError(
                "The model called its layers in a different order in "
                "float32 and under the mixed policy; diagnose cannot pair "
                "their outputs."
            )
        for j, index in enumerate(reference.keys):
            self.dtypes.setdefault(index, _dtype(mixed.outputs[j]))
            self.reference_dtypes.setdefault(
                index, _dtype(reference.outputs[j])
            )
            self.counters["activations"][index].add(
                _numpy(reference.outputs[j]), _numpy(mixed.outputs[j])
            )
            if reference.output_gradients[j] is not None:
                self.counters["activation_gradients"][index].add(
                    _numpy(reference.output_gradients[j]),
                    _numpy(mixed.output_gradients[j]),
                )
        for index, ref_grad, mixed_grad in zip(
            self._owners, reference.weight_gradients, mixed.weight_gradients
        ):
            if ref_grad is not None:
                self.counters["weight_gradients"][index].add(
                    _numpy(ref_grad), _numpy(mixed_grad)
                )


def _dtype(tensor):
    return keras.backend.standardize_dtype(tensor.dtype)


def _numpy(tensor):
    return None if tensor is None else ops.convert_to_numpy(tensor)
