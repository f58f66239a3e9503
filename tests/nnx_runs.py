"""kmp under Keras's NNX mode (JAX, Keras's layers Flax NNX modules).

    python tests/nnx_runs.py swap|loop|block|fit|gpt2|llama|all

Prints one JSON line (prefix RESULT). A helper for the tests that check
kmp under NNX (`util.run_under_nnx`): Keras reads `KERAS_NNX_ENABLED`
when it is imported, so each runs in its own process.
"""

import functools
import json
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
os.environ["KERAS_NNX_ENABLED"] = "true"

import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from keras.src.saving import object_registration  # noqa: E402
from util import small_gpt2_backbone  # noqa: E402

import kmp  # noqa: E402


def swap():
    """Each of kmp's layer classes put in place of its Keras class (the
    layout check Python makes, on a bare instance), and a model's Softmax
    and MultiHeadAttention pinned."""
    refused = {}
    for name, cls in object_registration.GLOBAL_CUSTOM_OBJECTS.items():
        if not (name.startswith("kmp>") and isinstance(cls, type)):
            continue
        if not issubclass(cls, keras.layers.Layer):
            continue
        stock = next(c for c in cls.__mro__ if c.__module__[:4] != "kmp.")
        layer = object.__new__(stock)
        try:
            object.__setattr__(layer, "__class__", cls)
        except TypeError as e:
            refused[name] = str(e)
    kmp.enable("mixed_float16")
    inputs = keras.Input((4, 8))
    x = keras.layers.Softmax()(keras.layers.Dense(8)(inputs))
    x = keras.layers.MultiHeadAttention(2, 4)(x, x)
    model = keras.Model(inputs, keras.layers.Dense(2)(x))
    kmp.pin_float32(model)
    attention = model.layers[3]
    return {
        "nnx": keras.config.is_nnx_enabled(),
        "refused": refused,
        "classes": [type(layer).__name__ for layer in model.layers],
        "attention_softmax": type(attention._softmax).__name__,
    }


class _Regression(keras.Model):
    """keras-io's NNX guide's model: its Dense an inner layer, so
    `kmp.pin_float32` casts the model's output (`return_float32`)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense_layer = keras.layers.Dense(1)

    def call(self, inputs):
        return self.dense_layer(inputs)


def _squared_error(y, outputs):
    return jnp.mean((y - outputs.astype("float32")) ** 2)


def _train_in_nnx_loop(model, x, y, steps, learning_rate, loss=_squared_error):
    """keras-io's NNX guide's loop (`nnx.jit`, `nnx.grad`,
    `nnx.Optimizer`), on batches of 10 of `x` (arrays, or a dict of
    them) and `y`; returns the largest change of each trainable weight,
    by path."""
    trainable = nnx.All(keras.Variable, lambda path, v: v.trainable)
    optimizer = nnx.Optimizer(model, optax.sgd(learning_rate), wrt=trainable)
    objective = loss

    @nnx.jit
    def train_step(model, optimizer, x, y):
        def loss(model_):
            return objective(y, model_(x))

        grads = nnx.grad(loss, argnums=nnx.DiffState(0, trainable))(model)
        optimizer.update(model, grads)

    before = [np.array(v) for v in model.trainable_weights]
    rng = np.random.default_rng(1)
    for _ in range(steps):
        batch = rng.choice(len(y), size=10)
        x_batch = keras.tree.map_structure(lambda a, b=batch: a[b], x)
        train_step(model, optimizer, x_batch, y[batch])
    return {
        v.path: float(np.abs(np.array(v) - b).max())
        for v, b in zip(model.trainable_weights, before)
    }


def loop():
    """The guide's regression, 200 steps, in float32 and pinned under
    kmp's float16."""
    results = {}
    x = np.linspace(-np.pi, np.pi, 100)[:, None].astype("float32")
    noise = np.random.default_rng(0).normal(0, 0.1, size=x.shape)
    y = (0.8 * x + 0.1 + noise).astype("float32")
    for mode in ("float32", "mixed_float16"):
        kmp.enable(mode)
        keras.utils.set_random_seed(0)
        model = _Regression()
        model(x)
        kmp.pin_float32(model)
        moved = _train_in_nnx_loop(model, x, y, 200, 1e-3)
        loss = float(jnp.mean((y - model(x)) ** 2))
        results[mode] = {"moved": moved, "loss": loss}
    return results


def block():
    """A pinned attention and GELU block in the guide's loop, 3 steps
    (bfloat16: XLA's CPU dot has no float16 attention); the marks of the
    layers' calls (an einsum's GELU wraps its flat bias's call)."""
    kmp.enable("mixed_bfloat16")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4, 8))
    x = keras.layers.MultiHeadAttention(2, 4, name="attention")(inputs, inputs)
    x = keras.layers.Dense(8, activation="gelu", name="gelu")(x)
    x = keras.layers.EinsumDense(
        "btd,dhe->bthe",
        (4, 2, 4),
        bias_axes="he",
        activation="gelu",
        name="gelu_einsum",
    )(x)
    outputs = keras.layers.Dense(1)(keras.layers.Flatten()(x))
    model = kmp.pin_float32(keras.Model(inputs, outputs))
    x = np.random.default_rng(0).normal(size=(16, 4, 8)).astype("float32")
    calls = {x.path: vars(x).get("call") for x in model._flatten_layers()}
    return {
        "wrapped": {  # each wrapped layer's marks
            path: sorted(k for k in vars(call) if k.startswith("_kmp_"))
            for path, call in calls.items()
            if call is not None
        },
        "moved": _train_in_nnx_loop(model, x, x.sum((1, 2))[:, None], 3, 1e-2),
    }


def fit():
    """`fit` under kmp's float16 with `LossScaleMonitor`: the epoch logs
    and the monitor's per-step record."""
    kmp.enable("mixed_float16")
    keras.utils.set_random_seed(0)
    model = kmp.pin_float32(
        keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)]
        )
    )
    model.compile(optimizer=kmp.wrap("sgd", initial_scale=1024), loss="mse")
    monitor = kmp.callbacks.LossScaleMonitor()
    x = np.random.default_rng(0).random((16, 4))
    history = model.fit(
        x, x[:, :1], batch_size=4, epochs=2, verbose=0, callbacks=[monitor]
    )
    return {"logs": history.history, "steps": monitor.history}


def _next_token_loss(y, logits):
    return jnp.mean(
        keras.losses.sparse_categorical_crossentropy(
            y, logits.astype("float32"), from_logits=True
        )
    )


def _causal_lm(name):
    """A tiny KerasHub GPT-2 (a position embedding, Keras's attention in
    KerasHub's `TransformerDecoder`) or Llama (KerasHub's own decoder
    and attention), a CausalLM without a preprocessor."""
    import keras_hub

    if name == "gpt2":
        model = keras_hub.models.GPT2CausalLM(
            small_gpt2_backbone(), preprocessor=None
        )
    else:
        backbone = keras_hub.models.LlamaBackbone(
            vocabulary_size=64,
            num_layers=1,
            num_query_heads=2,
            num_key_value_heads=1,
            hidden_dim=16,
            intermediate_dim=32,
        )
        model = keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)
    # KerasHub's task compiles itself, and Keras 3.15's compiled model
    # keeps a dict keyed by layers, which NNX's flatten cannot sort
    # (KerasHub's vLLM wrapper keeps the backbone alone for it); a
    # hand-written loop has no use for it.
    del vars(model)["_compiled_trainable_state"]
    return model


def _spied_attention():
    """The `is_causal` each JAX attention call gets and the
    `use_causal_mask` each Keras `_compute_attention` call gets, as
    lists by name."""
    import jax

    told = {"is_causal": [], "use_causal_mask": []}
    stock = jax.nn.dot_product_attention
    keras_stock = keras.layers.MultiHeadAttention._compute_attention

    def spy(*args, **kwargs):
        told["is_causal"].append(kwargs.get("is_causal"))
        return stock(*args, **kwargs)

    @functools.wraps(keras_stock)  # its signature: attend_causally reads it
    def keras_spy(*args, **kwargs):
        told["use_causal_mask"].append(kwargs.get("use_causal_mask"))
        return keras_stock(*args, **kwargs)

    jax.nn.dot_product_attention = spy
    keras.layers.MultiHeadAttention._compute_attention = keras_spy
    return told


def _hub(name):
    """KerasHub's GPT-2 or Llama (`_causal_lm`), 20 steps of the guide's
    loop on next tokens, unpinned in float32 and pinned under kmp's
    bfloat16 (XLA's CPU dot has no float16 attention): each weight's
    change (or the error the loop raised), the loss after, whether a
    position embedding broadcasts once and a decoder attends causally,
    and what the attention calls in the loop were told
    (`_spied_attention`; told, the attention running is the one its
    decoder told)."""
    from kmp.islands import attends_causally
    from kmp.islands import broadcasts_once

    told = _spied_attention()
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 64, size=(16, 9)).astype("int32")
    x = {"token_ids": tokens[:, :-1], "padding_mask": tokens[:, :-1] > 0}
    y = tokens[:, 1:]
    results = {}
    for mode in ("float32", "mixed_bfloat16"):
        kmp.enable(mode)
        keras.utils.set_random_seed(0)
        model = _causal_lm(name)
        model(x)
        if mode != "float32":
            kmp.pin_float32(model)
        layers = list(model._flatten_layers())
        for calls in told.values():
            calls.clear()
        result = results[mode] = {
            "broadcast_once": any(map(broadcasts_once, layers)),
            "attend_causally": any(map(attends_causally, layers)),
        }
        try:
            result["moved"] = _train_in_nnx_loop(
                model, x, y, 20, 0.1, loss=_next_token_loss
            )
        except Exception as e:  # a wrapper running the original's layers
            result["error"] = f"{type(e).__name__}: {e}"[:300]
            continue
        for key, calls in told.items():
            result[key] = sorted(set(map(str, calls)))
        result["loss"] = float(_next_token_loss(y, model(x)))
    return results


CASES = {
    "swap": swap,
    "loop": loop,
    "block": block,
    "fit": fit,
    "gpt2": lambda: _hub("gpt2"),
    "llama": lambda: _hub("llama"),
}


def every_case():
    """Each case's result, in one process (the tests' way: one start of
    JAX, Flax and KerasHub instead of six); a case that raises gives its
    error, and the others run on."""
    import traceback

    results = {"nnx": keras.config.is_nnx_enabled()}
    for name, case in CASES.items():
        keras.utils.clear_session()
        kmp.disable()
        try:
            results[name] = case()
        except Exception:
            results[name] = {"raised": traceback.format_exc()}
    return results


if __name__ == "__main__":
    name = sys.argv[1]
    result = every_case() if name == "all" else CASES[name]()
    print("RESULT " + json.dumps(result))
