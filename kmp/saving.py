"""`kmp.load_model`: a `.keras` file back with what Keras's load leaves out.

Keras's `load_model` rebuilds each layer from its config. Two things kmp
set up do not come back that way, and `kmp.load_model` puts them back:

- Float32 islands inside layers that other layers make in code
  (KerasHub's attention, a custom block's `MultiHeadAttention`): their
  softmax has no weights, hence no path a `DTypePolicyMap` could name,
  so the load rebuilds it in half precision. `kmp.pin_float32` runs
  again (it changes nothing that is pinned already).
- The compiled optimizer, scaler included, of a model whose class has
  its own `compile` (KerasHub's tasks): Keras skips `compile` on load
  and warns. Here the model is compiled with the file's compile config,
  and the optimizer's saved state (slots, loss scale) is loaded into it.

Float8 layers and the islands a config lists need nothing: Keras's load
keeps them (`kmp.float8` and `kmp.pin_float32` record them so).
"""

import json
import warnings
import zipfile

import keras

from kmp.errors import InputError
from kmp.islands import pin_float32
from kmp_config.names import HALF_DTYPES

# Keras's warning when it skips a custom `compile` on load: kmp does it.
_SKIPPED_COMPILE = "`compile\\(\\)` was not called as part of model loading"


def load_model(filepath, custom_objects=None, compile=True, safe_mode=True):
    """Loads a `.keras` model as `keras.saving.load_model` does, then puts
    back kmp's float32 islands and a custom-compiled model's optimizer.

    Call it under the policy you train with (`kmp.enable(...)` first).
    After Keras's load:

    - if any layer computes in float16 or bfloat16, `kmp.pin_float32`
      runs on the model: the softmax islands that a `.keras` file cannot
      keep (inside KerasHub's attention layers, for one) come back, and
      everything pinned already stays as it is;
    - if the model's class has its own `compile` (KerasHub's tasks),
      which Keras does not call on load, the model is compiled with the
      file's compile config (kmp's `LossScaleOptimizer` included) and the
      optimizer's saved state is loaded, so training resumes where it
      stopped.

    Args:
        filepath: Path to a `.keras` file.
        custom_objects: As for `keras.saving.load_model`.
        compile: Whether to compile the model as it was saved.
        safe_mode: As for `keras.saving.load_model`.

    Returns:
        The model.

    Example:

    ```python
    kmp.enable("mixed_bfloat16")
    model = kmp.load_model("gpt2.keras")  # pinned, compiled, resumable
    model.fit(data, epochs=1)
    ```
    """
    if not str(filepath).endswith(".keras"):
        raise InputError(
            f"kmp.load_model reads .keras files, got {str(filepath)!r}; "
            "load other formats with keras.saving.load_model."
        )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SKIPPED_COMPILE)
        # The skipped compile leaves an unbuilt optimizer, whose saved
        # variables Keras then declines to load; compiled below.
        warnings.filterwarnings(
            "ignore", message="Skipping variable loading for optimizer"
        )
        model = keras.saving.load_model(
            filepath,
            custom_objects=custom_objects,
            compile=compile,
            safe_mode=safe_mode,
        )
    if compile and type(model).compile is not keras.Model.compile:
        _compile_as_saved(model, filepath, custom_objects, safe_mode)
    if any(
        getattr(layer, "compute_dtype", None) in HALF_DTYPES
        for layer in model._flatten_layers()
    ):
        pin_float32(model)
    return model


def _compile_as_saved(model, filepath, custom_objects, safe_mode):
    """Compiles `model` with the file's compile config and loads the saved
    optimizer state (Keras's `load_weights` reads both from the file)."""
    with zipfile.ZipFile(filepath) as archive:
        config = json.loads(archive.read("config.json"))
    compile_config = config.get("compile_config")
    if not compile_config:
        return
    arguments = keras.saving.deserialize_keras_object(
        compile_config, custom_objects=custom_objects, safe_mode=safe_mode
    )
    model.compile(**arguments)
    model.optimizer.build(model.trainable_variables)
    model.load_weights(filepath)
