"""tf-keras's loss-scaling API on a Keras 3 `LossScaleOptimizer`.

tf-keras custom loops call `get_scaled_loss` on the loss and
`get_unscaled_gradients` on the gradients, then `apply_gradients`. Keras 3
removed both methods (keras-team/keras#19479, #20894), and its
`apply_gradients` divides by the scale itself, so a ported loop that only
renamed the calls would divide twice. `TfKerasLossScaleAPI` restores the
two methods and remembers the gradients it unscaled: when the very same
tensors reach the next `apply`, the optimizer does not divide them again.

And `apply_gradients`, which TensorFlow's `fit` and tf-keras loops call,
hands the inner optimizer its unscaled gradients through the inner's own
`apply_gradients` where its class has one, as that code would run in
float32 (keras-io's gradient centralization, written as an
`apply_gradients` override; Keras's scaler calls the inner `apply`
whatever the entry: BUILD_NOTES, defect 38).
"""

import keras
from keras import ops


class TfKerasLossScaleAPI:
    """Mixin for a `keras.optimizers.LossScaleOptimizer` subclass.

    The subclass calls `_take_user_unscaled(grads)` at the start of each
    `apply`: True when `grads` are the very tensors
    `get_unscaled_gradients` returned, which must not be divided again.
    """

    # Gradients returned by `get_unscaled_gradients`, until the next apply.
    _user_unscaled = None
    # Whether the running apply came in through `apply_gradients`; read
    # while a step is traced (a class default: torch.compile guards on an
    # instance's attributes).
    _via_apply_gradients = False

    def apply_gradients(self, grads_and_vars):
        self._via_apply_gradients = True
        try:
            return super().apply_gradients(grads_and_vars)
        finally:
            self._via_apply_gradients = False

    def _inner_applies_gradients(self) -> bool:
        """Whether this apply's unscaled gradients go through the inner
        optimizer's own `apply_gradients` (the module's docstring)."""
        own = type(self.inner_optimizer).apply_gradients
        return self._via_apply_gradients and (
            own is not keras.optimizers.Optimizer.apply_gradients
        )

    def _take_user_unscaled(self, grads) -> bool:
        pending = self._user_unscaled
        if pending is None:
            # Nothing written: torch.compile guards on the instance's
            # attributes, and one that appears after the first step
            # would recompile the step.
            return False
        self._user_unscaled = None
        return _same_tensors(grads, pending)

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
