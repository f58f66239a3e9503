"""tf-keras's loss-scaling API on a Keras 3 `LossScaleOptimizer`.

tf-keras custom loops call `get_scaled_loss` on the loss and
`get_unscaled_gradients` on the gradients, then `apply_gradients`. Keras 3
removed both methods (keras-team/keras#19479, #20894), and its
`apply_gradients` divides by the scale itself, so a ported loop that only
renamed the calls would divide twice. `TfKerasLossScaleAPI` restores the
two methods and remembers the gradients it unscaled: when the very same
tensors reach the next `apply`, the optimizer does not divide them again.
"""

from keras import ops


class TfKerasLossScaleAPI:
    """Mixin for a `keras.optimizers.LossScaleOptimizer` subclass.

    The subclass asks `self._given_unscaled` (True during an `apply` of
    the tensors `get_unscaled_gradients` returned) before dividing by the
    scale.
    """

    # Gradients returned by `get_unscaled_gradients`, until the next apply.
    _user_unscaled = None
    _given_unscaled = False

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        pending, self._user_unscaled = self._user_unscaled, None
        self._given_unscaled = pending is not None and _same_tensors(
            grads, pending
        )
        try:
            return super().apply(grads, trainable_variables)
        finally:
            self._given_unscaled = False

    def get_scaled_loss(self, loss):
        """Returns `loss * loss_scale` (tf-keras API; Keras 3: `scale_loss`).

        Args:
            loss: A scalar tensor, or a callable returning one.

        Returns:
            The scaled loss, or a callable returning it if `loss` was
            callable.
        """
        if callable(loss):
            return lambda: self.scale_loss(loss())
        return self.scale_loss(loss)

    def get_unscaled_gradients(self, grads):
        """Divides gradients of the scaled loss by the loss scale.

        tf-keras custom loops call this and then `apply_gradients`. To keep
        such loops correct, when the very tensors returned here are passed
        to the next `apply_gradients`, they are not divided again. (Keras 3
        loops instead pass the scaled gradients straight to
        `apply_gradients`, which unscales them.)

        Args:
            grads: A list of gradient tensors (or `None`s).

        Returns:
            The unscaled gradients, as a list.
        """
        scale = self.loss_scale
        unscaled = [g if g is None else ops.divide(g, scale) for g in grads]
        self._user_unscaled = tuple(unscaled)
        return unscaled


def _same_tensors(grads, pending):
    return len(grads) == len(pending) and all(
        g is p for g, p in zip(grads, pending)
    )
