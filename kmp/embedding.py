"""`kmp.layers.TokenAndPositionEmbedding`: the embedding of the IMDB
example's Transformer, in the library so that a model `kmp train imdb`
writes loads wherever kmp is imported.

Keras finds a registered class only once its module has been imported,
and it imports modules itself only for `keras*` packages. A layer defined
in an example would make `keras.saving.load_model` (and `kmp audit`)
fail on that example's own `.keras` file unless the example had been
imported first; `import kmp` imports this module.
"""

import keras
from keras import ops

# Files written by kmp 0.1.0 name the layer as the example registered it.
OLD_NAME = "kmp_examples>TokenAndPositionEmbedding"


@keras.saving.register_keras_serializable(package="kmp")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """A token embedding plus a learned embedding of each position.

    The sum of `Embedding(vocabulary_size, d_model)` of the token ids and
    `Embedding(sequence_length, d_model)` of their positions 0, 1, ...,
    as in KerasHub's layer of the same name. Lookups, not matmuls: kmp
    pins nothing here and `kmp.float8` leaves it alone.

    Args:
        sequence_length: Int. The longest sequence (positions embedded).
        vocabulary_size: Int. The number of token ids.
        d_model: Int. The embedding size.
        **kwargs: Base layer keyword arguments, such as `name` and `dtype`.

    Example:

    ```python
    inputs = keras.Input((128,), dtype="int32")
    x = kmp.layers.TokenAndPositionEmbedding(128, 20_000, 64)(inputs)
    ```
    """

    def __init__(self, sequence_length, vocabulary_size, d_model, **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = sequence_length
        self.vocabulary_size = vocabulary_size
        self.d_model = d_model
        self.tokens = keras.layers.Embedding(
            vocabulary_size, d_model, dtype=self.dtype_policy
        )
        self.positions = keras.layers.Embedding(
            sequence_length, d_model, dtype=self.dtype_policy
        )

    def build(self, input_shape):
        self.tokens.build(input_shape)
        self.positions.build((self.sequence_length,))

    def call(self, inputs):
        positions = ops.arange(ops.shape(inputs)[-1])
        return self.tokens(inputs) + self.positions(positions)

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.d_model)

    def get_config(self):
        return {
            **super().get_config(),
            "sequence_length": self.sequence_length,
            "vocabulary_size": self.vocabulary_size,
            "d_model": self.d_model,
        }


keras.saving.get_custom_objects()[OLD_NAME] = TokenAndPositionEmbedding
