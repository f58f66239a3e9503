"""The dynamic loss scale: `kmp.LossScaleOptimizer` and `kmp.wrap`.

    scale_rule            the rule as one function of the scale's state
                          (`next_scale_state`), and its arguments checked
                          (`check_rule`, `ScaleRule`)
    _tf_keras_api         tf-keras's `get_scaled_loss` /
                          `get_unscaled_gradients` on a Keras 3 scaler
    keras_float8          Keras's own float8 layers' gradient scaling
                          kept in units of the loss scale
    scaled_losses         which losses the scaler scaled: a train step of
                          the user's own that never scales its loss gets
                          its gradients applied as they are, and one line
    loss_scale_optimizer  `kmp.LossScaleOptimizer`: Keras's scaler with
                          kmp's rule, replicas in agreement, skip counts
    wrap                  which scaler a model gets (`kmp.wrap`), and
                          Keras's own scaler made kmp's in place

Imports from kmp: backend, errors, memory, policy.

The rule is written out once, as pseudo-code, in
`kmp.LossScaleOptimizer`'s docstring.
"""

from kmp.scaling.loss_scale_optimizer import LossScaleOptimizer
from kmp.scaling.scale_rule import ScaleRule
from kmp.scaling.scale_rule import ScaleState
from kmp.scaling.scale_rule import check_rule
from kmp.scaling.scale_rule import next_scale_state
from kmp.scaling.wrap import upgrade_stock_scaler
from kmp.scaling.wrap import wrap

__all__ = [
    "LossScaleOptimizer",
    "ScaleRule",
    "ScaleState",
    "check_rule",
    "next_scale_state",
    "upgrade_stock_scaler",
    "wrap",
]
