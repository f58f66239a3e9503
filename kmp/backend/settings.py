"""Process-wide settings a backend keeps in its own place: the
persistent XLA compilation cache and TF32 matmuls.
"""

import os

from kmp.backend._current import name


def use_compile_cache(directory: str | None) -> str | None:
    """Points the persistent XLA cache at `directory` (`None`: off);
    returns `None`, or why this backend cannot have one (BUILD_NOTES)."""
    if name() == "jax":
        import jax
        from jax.experimental.compilation_cache import compilation_cache

        jax.config.update("jax_compilation_cache_dir", directory)
        # Cache every program (JAX skips those compiled in under 1 s).
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        compilation_cache.reset_cache()  # read the directory at next use
        return None
    if name() == "torch":
        return (
            "Keras runs torch eagerly unless jit_compile=True, and "
            "torch.compile keeps its own cache (TORCHINDUCTOR_CACHE_DIR)"
        )
    if name() != "tensorflow":
        return f"{name()} has none kmp can switch on"
    key = "--tf_xla_persistent_cache_directory="
    flags = os.environ.get("TF_XLA_FLAGS", "").split()
    if directory and key + directory in flags:
        return None  # already so (a second run in this process)
    flags = [f for f in flags if not f.startswith(key)]
    from tensorflow.python.eager import context  # (no public API)

    if directory and context.context()._initialized:
        return "TensorFlow has started (it reads TF_XLA_FLAGS once)"
    added = [key + directory] if directory else []
    os.environ["TF_XLA_FLAGS"] = " ".join(flags + added)
    return None


def disable_tf32() -> None:
    """Turns off TF32 matmuls, so float32 means float32 (for tests)."""
    if name() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(False)
    elif name() == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")
    elif name() == "torch":
        import torch

        # PyTorch's own defaults: TF32 off for matmuls, on for cuDNN
        # convolutions.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def tf32_enabled() -> bool | None:
    """Whether float32 matmuls may run as TF32; `None` if unknown."""
    if name() == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.experimental.tensor_float_32_execution_enabled())
    if name() == "jax":
        import jax

        precision = jax.config.jax_default_matmul_precision
        return precision not in ("highest", "float32")
    if name() == "torch":
        import torch

        return bool(
            torch.backends.cuda.matmul.allow_tf32
            or torch.backends.cudnn.allow_tf32
        )
    return None
