"""Keras's `BatchNormalization`, its float32 statistics computed in one
fused kernel on torch.

Keras computes batch normalization in float32, whatever the policy, from
ops: on eager torch each is a kernel, and so is each gradient
(`kmp.backend.fused_batch_norm` has the count). This layer hands the
same arithmetic to torch's own batch-norm kernel, which keeps the
statistics and parameters in float32 and reads and writes the 16-bit
activation as it is, without the float32 copy Keras's cast makes. What
stays Keras's: the variables, the moving averages' rule (Keras's
momentum, the biased batch variance), the config and the file. Masks,
batch renormalization, `synchronized=True`, TensorFlow and JAX (whose
XLA fuses Keras's ops already) take Keras's own call.

`kmp.pin_float32` puts it in place of each exact Keras
`BatchNormalization` on torch. The class is named as Keras's, as
`kmp.islands.MultiHeadAttention` is: a `.keras` file names a subclassed
model's weights by its layers' class names.
"""

import keras
from keras import ops

from kmp import backend


@keras.saving.register_keras_serializable(package="kmp")
class BatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization`, computed by one fused kernel on
    torch.

    The same normalization, moving averages and variables as Keras's,
    within float32's rounding; see the module docstring for when Keras's
    own call runs instead.

    Args:
        **kwargs: As for `keras.layers.BatchNormalization`.

    Example:

    ```python
    kmp.enable("mixed_bfloat16")
    model = kmp.pin_float32(build_model())  # on torch: this layer
    ```
    """

    def call(self, inputs, training=None, mask=None):
        fused = None
        if mask is None and not self.renorm and not self.synchronized:
            learning = bool(training) and self.trainable
            fused = backend.fused_batch_norm(
                inputs,
                self.gamma if self.scale else None,
                self.beta if self.center else None,
                self.moving_mean,
                self.moving_variance,
                self.axis,
                self.epsilon,
                learning,
            )
        if fused is None:
            return super().call(inputs, training=training, mask=mask)
        outputs, mean, variance = fused
        if mean is not None:
            momentum = self.momentum
            self.moving_mean.assign(
                self.moving_mean * momentum + mean * (1.0 - momentum)
            )
            self.moving_variance.assign(
                self.moving_variance * momentum + variance * (1.0 - momentum)
            )
        return ops.cast(outputs, self.compute_dtype)
