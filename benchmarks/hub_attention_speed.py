"""KerasHub's Llama and Gemma 3 told their causal mask and sliding window:
the train step's time against KerasHub's mask alone.

    KERAS_BACKEND=jax python benchmarks/hub_attention_speed.py
    KERAS_BACKEND=jax python benchmarks/hub_attention_speed.py --size small

`benchmarks/gpu_compile.py`'s `llama` and `gemma` programs, timed:
KerasHub's Llama at width 2048 (16 query heads, 4 key/value heads, feed
forward 5632) and Gemma 3's text backbone in its 1B model's shape (width
1152, 4 query heads, 1 key/value head of 256, feed forward 6912,
post-norms, every block's window 512 tokens), a vocabulary of 32,000,
`--layers` decoder blocks, pinned under `mixed_bfloat16`, AdamW under
`kmp.wrap`; Keras's `train_step` jitted with its state donated, as
`fit` compiles it, on random tokens without padding. Gemma's attention
takes KerasHub's fused call as on a GPU (KerasHub asks the machine
first; `gpu_compile.py` does the same). Variants, each one way to give
cuDNN's flash attention the causal mask:

- `pinned`: as `kmp.pin_float32` leaves the model: KerasHub's fused call
  with `is_causal=True` beside the mask (cuDNN's `CAUSAL` mask type), and
  Gemma's window told where cuDNN takes it (`kmp.backend.causal_attention`:
  cuDNN 9.10.2 or later, and a compile of the attention alone);
- `nowindow` (Gemma): the same, the window not told (kmp's check answering
  no while the step compiles): every causal block computed, the window
  masked within them;
- `hubcausal`: KerasHub's mask alone (`attend_causally` undone:
  `NO_MASK`, every block of the scores computed).

Each variant's step is compiled first, its cuDNN attention calls counted
by mask type and window in the compiled program (`hlo_kernels.py`), then
the variants of a model are timed interleaved, `--steps` steps a round
over `--rounds` rounds; the record has each one's median step, tokens/s
and its speed against `hubcausal` (the median of the per-round ratios).
On a CPU (`--size small`: 2 blocks of width 64, 2 x 64 tokens, a window
of 16) the attention is XLA's: a check of the script, not a figure.
"""

import argparse
import contextlib
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The variants live at once (they are interleaved).
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")

import common  # noqa: E402
import hlo_kernels  # noqa: E402
import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from lm_speed import train_state  # noqa: E402

import kmp  # noqa: E402
from kmp import backend  # noqa: E402

SIZES = {
    "gpu": {"layers": 4, "batch": 8, "sequence": 1024, "scale": 1},
    # Widths divided by 32 (heads by 4), the window by 32.
    "small": {"layers": 2, "batch": 2, "sequence": 64, "scale": 32},
}
VARIANTS = {
    "llama": ("pinned", "hubcausal"),
    "gemma": ("pinned", "nowindow", "hubcausal"),
}


def llama(layers, scale=1):
    """KerasHub's Llama causal LM at width 2048 / `scale`."""
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=32000 // scale,
        num_layers=layers,
        num_query_heads=max(16 // scale, 4),
        num_key_value_heads=max(4 // scale, 1),
        hidden_dim=2048 // scale,
        intermediate_dim=5632 // scale,
    )
    return keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)


def gemma(layers, scale=1):
    """KerasHub's Gemma 3 text causal LM in its 1B model's shape (widths
    and window / `scale`), its attention taking KerasHub's fused call as
    on a GPU."""
    import keras_hub
    from keras_hub.src.models.gemma3 import gemma3_attention

    # KerasHub asks the machine for a GPU (`running_on_gpu`) before its
    # fused call; a GPU that supports it says yes, a CPU no.
    gemma3_attention.CachedGemma3Attention._use_fused_attention_op = (
        lambda self: self.dropout == 0
    )
    backbone = keras_hub.models.Gemma3Backbone(
        vocabulary_size=32000 // scale,
        image_size=16,  # no vision encoder: the text backbone
        num_layers=layers,
        num_query_heads=4,
        num_key_value_heads=1,
        hidden_dim=1152 // scale,
        intermediate_dim=6912 // scale,
        head_dim=256 // scale,
        use_post_ffw_norm=True,
        use_post_attention_norm=True,
        use_sliding_window_attention=True,
        sliding_window_size=512 // scale,
    )
    return keras_hub.models.Gemma3CausalLM(backbone=backbone, preprocessor=None)


MODELS = {"llama": llama, "gemma": gemma}


def compiled_model(build, variant):
    """The model `build()` makes, pinned, compiled with AdamW under
    `kmp.wrap`, with `variant`'s attention (module docstring)."""
    with kmp.policy_scope("mixed_bfloat16"):
        keras.utils.set_random_seed(0)
        model = build()
        kmp.pin_float32(model)
    if variant == "hubcausal":
        for layer in model._flatten_layers():
            if kmp.islands.attends_causally(layer):
                del layer.call
    model.compile(
        optimizer=kmp.wrap(keras.optimizers.AdamW(1e-4)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.optimizer.build(model.trainable_variables)
    return model


@contextlib.contextmanager
def window_untold():
    """kmp's check of whether cuDNN takes a window answering no."""
    from kmp.backend import attention

    takes = attention._takes_window
    attention._takes_window = lambda *args: False
    try:
        yield
    finally:
        attention._takes_window = takes


def prepared(name, variant, size):
    """`(run, record)`: `run(steps)` trains `steps` steps of `name`'s
    `variant` and returns the last loss; `record`, its compiled step's
    attention calls."""
    build = MODELS[name]
    model = compiled_model(
        lambda: build(size["layers"], size["scale"]), variant
    )
    batch, sequence = size["batch"], size["sequence"]
    tokens = np.random.default_rng(0).integers(
        1, 32000 // size["scale"], (batch, sequence), dtype="int32"
    )
    data = (
        {"token_ids": tokens, "padding_mask": np.ones_like(tokens, bool)},
        tokens,
    )
    # Keras builds the loss's and metrics' state on a first call, as
    # `fit` does before it compiles (the step's state then keeps its
    # structure).
    model._symbolic_build(data_batch=data)
    start = time.perf_counter()
    context = (
        window_untold() if variant == "nowindow" else contextlib.nullcontext()
    )
    with context:
        step = (
            jax.jit(model.train_step, donate_argnums=0)
            .lower(train_state(model), data)
            .compile()
        )
    counts = hlo_kernels.summary(step.as_text(), bandwidth=1.0)
    record = {
        "model": name,
        "variant": variant,
        "compile_s": time.perf_counter() - start,
        "attention_mask_types": counts["attention_mask_types"],
        "attention_windows": counts["attention_windows"],
    }
    state = [train_state(model)]

    def run(steps):
        for _ in range(steps):
            logs, state[0] = step(state[0], data)
        return float(jax.block_until_ready(logs["loss"]))

    return run, record


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="gpu")
    parser.add_argument("--models", default="llama,gemma")
    parser.add_argument("--layers", type=int, default=0, help="0: the size's")
    parser.add_argument("--batch_size", type=int, default=0)
    parser.add_argument("--sequence_length", type=int, default=0)
    parser.add_argument("--steps", type=int, default=10, help="a round's")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None, help="JSON path")
    args = parser.parse_args()
    if backend.name() != "jax":
        parser.error("runs on Keras's JAX backend: KERAS_BACKEND=jax")
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"--models takes {sorted(MODELS)}; got {unknown}")
    size = dict(SIZES[args.size])
    size["layers"] = args.layers or size["layers"]
    size["batch"] = args.batch_size or size["batch"]
    size["sequence"] = args.sequence_length or size["sequence"]
    records = []
    result = {"benchmark": "hub_attention_speed", "size": size, "runs": records}
    filename = f"hub_attention_speed_{args.size}_jax.json"
    for name in models:
        runs, rows = {}, {}
        for variant in VARIANTS[name]:
            run, record = prepared(name, variant, size)
            record["loss_first_round"] = run(args.steps)  # and warm
            runs[variant], rows[variant] = run, record
            records.append(record)
            print(name, variant, record, flush=True)
            common.write_result(result, filename, args.out)
        seconds = common.time_interleaved(
            {v: (lambda run=run: run(args.steps)) for v, run in runs.items()},
            args.rounds,
        )
        tokens = args.steps * size["batch"] * size["sequence"]
        for variant, record in rows.items():
            record["step_ms"] = (
                1e3 * statistics.median(seconds[variant]) / args.steps
            )
            record["tokens_per_s"] = tokens / statistics.median(
                seconds[variant]
            )
            record["speed_vs_hubcausal"] = statistics.median(
                h / s for h, s in zip(seconds["hubcausal"], seconds[variant])
            )
            print(
                f"{name} {variant}: {record['step_ms']:.2f} ms a step, "
                f"{record['speed_vs_hubcausal']:.3f}x hubcausal",
                flush=True,
            )
        common.write_result(result, filename, args.out)
        keras.backend.clear_session()


if __name__ == "__main__":
    main()
