"""Causal attention that tells cuDNN's flash attention its sliding window
(JAX).

KerasHub's Mistral, Mixtral and Gemma (2, 3 and 4) attend within a
sliding window: each token sees itself and the `window - 1` before it.
Their decoders cut the window into the mask, and on a GPU cuDNN's flash
attention then computes every block of scores that the causal mask
type keeps, below the window as well, and masks them. Told the window
(JAX's `local_window_size`, cuDNN's `sliding_window_length`), it skips
those blocks too: at a window of 512 in 1024 tokens, a quarter of the
causal scores (a sixth of their 128 x 128 tiles); at 512 in 4096, or
1024 in 8192, 77 % (72 %, 74 % of the tiles).

Keras's `ops.dot_product_attention` takes no window, so where cuDNN
takes one this calls `jax.nn.dot_product_attention` itself, as Keras's
JAX attention does on a GPU:

    if a window shorter than the keys, on JAX, not on a TPU, cuDNN >=
    9.10.2 and a GPU of compute capability >= 8.0, and cuDNN compiles
    the attention with this window for these shapes on this GPU:
        jax.nn.dot_product_attention(query, key, value, mask=mask,
            scale=scale, is_causal=True,
            local_window_size=(window - 1, 0), implementation="cudnn")
    else:
        ops.dot_product_attention(query, key, value, mask=mask,
            scale=scale, is_causal=True)

The mask still holds the window (and the padding), so both compute the
same values; the window only lets cuDNN skip blocks. One exception, as
for `is_causal` (`kmp.islands.causal_attention`): a query that may
attend no key at all (a padded position, with left padding longer than
the window) gets, from cuDNN, the mean of the values over the keys its
kernel computed, not over all of them; only padded positions' outputs
differ. cuDNN takes a window beside a mask (which JAX passes as a bias)
from 9.10.2 on (cuDNN frontend's support check,
`sdpa_support_surface.h`); the version and compute capability are read
as Keras's flash attention check reads them (`jax._src.cudnn`, JAX's own
names for them). A GPU builds cuDNN's kernels when XLA compiles the
step, where an unsupported graph fails the whole step; so the attention,
forward and backward, is compiled once alone for each shape, dtype and
window first (`_compiles`), and a failure keeps Keras's call. On a TPU
Keras takes its own Splash kernel, which the mask already serves.
"""

import functools
import warnings

from keras import ops

from kmp.backend._current import name

# The cuDNN version from which flash attention takes a sliding window
# beside a bias (the mask): 9.10.2.
WINDOW_WITH_BIAS = 91002
# The implementation `jax.nn.dot_product_attention` is asked for (a test
# on a CPU asks for JAX's own, "xla", which also takes the window).
IMPLEMENTATION = "cudnn"


def causal_attention(query, key, value, mask, scale, window=None):
    """`ops.dot_product_attention(query, key, value, mask=mask,
    scale=scale, is_causal=True)`, told `window` where cuDNN's flash
    attention takes it (module docstring).

    Args:
        query: `(batch, queries, heads, head_dim)`.
        key: `(batch, keys, key_heads, head_dim)`, as many keys as
            queries.
        value: As `key`.
        mask: A boolean mask `(batch, 1, queries, keys)`, causal, with
            the window cut in when there is one.
        scale: The scores' scale.
        window: None, or how many keys each query sees: itself and the
            `window - 1` before it.

    Returns:
        The attention's output, shaped as `query`.
    """
    # None, or a symbolic dimension, while Keras infers shapes.
    keys = key.shape[1]
    if (
        window is not None
        and name() == "jax"
        and isinstance(keys, int)
        and window < keys
        and _takes_window(query, key, value, mask, window)
    ):
        return _windowed(query, key, value, mask, scale, window)
    return ops.dot_product_attention(
        query, key, value, mask=mask, scale=scale, is_causal=True
    )


def _windowed(query, key, value, mask, scale, window):
    import jax

    return jax.nn.dot_product_attention(
        query,
        key,
        value,
        mask=mask,
        scale=scale,
        is_causal=True,
        local_window_size=(window - 1, 0),
        implementation=IMPLEMENTATION,
    )


def _takes_window(query, key, value, mask, window):
    """Whether cuDNN takes `window` for these operands here: JAX on a
    GPU whose cuDNN and compute capability do, and that compiles it."""
    import jax

    if jax.devices()[0].platform == "tpu":
        return False
    try:
        # JAX's private names, looked up at each call (the ones Keras's
        # flash check calls).
        from jax._src.cudnn import fused_attention_stablehlo as cudnn

        if cudnn.check_cudnn_version() < WINDOW_WITH_BIAS:
            return False
        if not cudnn.check_compute_capability("8.0"):
            return False
    except Exception:
        # No cuDNN (a RuntimeError), or a JAX whose private names changed
        # in any way: Keras's call, as Keras's own check does.
        return False
    shapes = tuple(
        (tuple(x.shape), str(x.dtype)) for x in (query, key, value, mask)
    )
    return _compiles(shapes, window)


@functools.cache
def _compiles(shapes, window):
    """Whether the attention with `window` compiles, forward and
    backward, for operands of `shapes` (`(shape, dtype)` of the query,
    key, value and mask) on this machine's default device. Once per
    process for each."""
    import jax

    def loss(query, key, value, mask):
        output = _windowed(query, key, value, mask, 1.0, window)
        return output.astype("float32").sum()

    specs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
    step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    try:
        step.lower(*specs).compile()
    except Exception as error:  # any refusal, JAX's checks' or cuDNN's
        warnings.warn(
            f"kmp: cuDNN's attention with a sliding window of {window} "
            f"did not compile for operands {shapes} ({type(error).__name__}"
            f": {str(error)[:300]}); those attentions run without the "
            "window told, as Keras calls them (the same values).",
            stacklevel=2,
        )
        return False
    return True
