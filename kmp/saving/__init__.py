"""`kmp.load_model`: a saved model back with what Keras's load leaves out.

    saved_compile    a model with its own `compile` (KerasHub's tasks,
                     keras-io's GANs) compiled on load as its file says,
                     with the optimizer state Keras's load skips
    checkpoint_dirs  an `OrbaxCheckpoint` directory: its config, pin mark
                     and saved paths, and the values Keras's load of it
                     drops by path, put back
    keras_names      Keras's generated layer names ranked, so that a
                     run's saved paths and a load's variables pair
    held_values      Keras's load of a directory, the values whose path
                     names a variable of another shape held back
    loading          `load_model`: Keras's load of a `.keras` file or a
                     checkpoint directory, then the float32 islands of a
                     model that was pinned, the compile and state above,
                     and kmp's float8 matmul

Imports from kmp: backend, errors, fp8, islands, model_layers, scaling.
"""

from kmp.saving.loading import load_model
from kmp.saving.loading import saved_policy

__all__ = ["load_model", "saved_policy"]
