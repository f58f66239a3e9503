"""Float32 islands: `kmp.pin_float32(model)` and the layers it puts in.

    float32_layers  `Float32Softmax`, `Float32Activation`,
                    `MultiHeadAttention`: Keras layers whose sensitive
                    part computes in float32 (kmp.layers)
    pin             `kmp.pin_float32`: outputs float32, inner softmaxes
                    and sigmoids float32 inside; what counts as sensitive

Imports from kmp: errors, layer_policies, model_layers.
"""

from kmp.islands.float32_layers import Float32Activation
from kmp.islands.float32_layers import Float32Softmax
from kmp.islands.float32_layers import MultiHeadAttention
from kmp.islands.pin import activation_name
from kmp.islands.pin import is_sensitive
from kmp.islands.pin import pin_float32

__all__ = [
    "Float32Activation",
    "Float32Softmax",
    "MultiHeadAttention",
    "activation_name",
    "is_sensitive",
    "pin_float32",
]
