"""Stage 2 of the doctor: the two passes over a batch, with taps.

Each batch runs through the model twice with the same weights: once with
every layer computing in float32 (the reference), once with the layers
under test in the mixed policy and the loss multiplied by the loss scale.
Both passes differentiate the loss by the trainable values and by every
tapped layer output (`kmp.backend.taped_gradients`), and both go through
`model.stateless_call`, so nothing the model holds (weights, batch-norm
statistics, seeds) changes. The policies are switched, and the taps
installed, only for as long as `two_passes` is open.
"""

import contextlib
import inspect
from typing import NamedTuple

from keras import ops

from kmp import backend
from kmp.doctor._progress import Progress
from kmp.doctor._taps import Taps
from kmp.doctor._taps import dtype_policies
from kmp.model_layers import all_layers


class PassResult(NamedTuple):
    """What one pass over one batch observed.

    Attributes:
        keys: The observed layer's index for each tapped output, in the
            order the layers ran.
        outputs: The tapped outputs, in the pass's dtypes.
        weight_gradients: The gradient by each trainable variable (of
            the scaled loss in the mixed pass), None where the loss does
            not depend on it.
        output_gradients: The gradient by each tapped output, in its
            dtype; None (TensorFlow) or zeros (JAX) where the loss does
            not depend on it.
    """

    keys: list
    outputs: list
    weight_gradients: list
    output_gradients: list


@contextlib.contextmanager
def two_passes(inputs, layers, progress=None):
    """Taps `layers` and yields `run(x, y, label) -> (reference, mixed)`.

    Args:
        inputs: The doctor's `Inputs`.
        layers: The layers to observe; their outputs' keys are their
            indices in this list.
        progress: A `Progress` that says each pass as it runs, after
            `run`'s `label` ("batch 1/2"); default: a quiet one.

    Yields:
        `run`, which returns one `PassResult` per pass.
    """
    progress = progress or Progress(verbose=False)
    model, scale = inputs.model, inputs.scale
    taps = Taps(layers)
    every_layer = all_layers(model)
    # As Keras's trainers do: `training` only where call() takes it.
    parameters = inspect.signature(model.call).parameters
    training = {"training": True} if "training" in parameters else {}

    def make_pass(loss_multiplier, reads):
        def loss_of(values, args, tap):
            x, y, non_trainable = args
            taps.start(tap)
            try:
                with reads():
                    y_pred, _ = model.stateless_call(
                        values, non_trainable, x, **training
                    )
            finally:
                taps.stop()
            return ops.multiply(inputs.loss_fn(y, y_pred), loss_multiplier)

        return backend.taped_gradients(loss_of, inputs.jit_compile)

    values = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    with taps:
        # The float32 pass reads every weight as float32: weights stored
        # in bfloat16 (`master_weights="bfloat16"`) too, which a layer
        # whose policy is float32 would otherwise get as stored.
        reference_pass = make_pass(1.0, backend.float32_reads)
        mixed_pass = make_pass(scale, contextlib.nullcontext)

        def run(x, y, label="batch"):
            with progress.step(f"{label}: float32 pass"):
                with dtype_policies(every_layer, "float32"):
                    reference = reference_pass(values, x, y, non_trainable)
            with progress.step(f"{label}: {inputs.policy} pass"):
                with dtype_policies(inputs.switched, inputs.policy):
                    mixed = mixed_pass(values, x, y, non_trainable)
            # Drop the loss: the doctor measures tensors, not the loss.
            return PassResult(*reference[1:]), PassResult(*mixed[1:])

        yield run
