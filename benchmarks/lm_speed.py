"""The language model's training speed near the hardware: MFU per step.

    KERAS_BACKEND=jax python benchmarks/lm_speed.py --configs 1024x16
    KERAS_BACKEND=jax python benchmarks/lm_speed.py --size small   # CPU check

`examples/lm.py`'s GPT-2 (KerasHub's `GPT2CausalLM` from a config,
`kmp.pin_float32`, AdamW under `kmp.wrap`), trained by `model.fit` on
synthetic byte sequences under `mixed_bfloat16`, in one process: each
variant is built and compiled (one warm-up epoch), timed once alone
(written at once, so a cut-off run still says something), then all
variants of a size are timed interleaved over `--rounds` epochs. A step
time is an epoch's steady one (`kmp.app.report.StepLog`: from its first
step's end to its last's, without the `fit` call's start and end, which
a long run spreads thin); `call_step_time_s` keeps the whole call's.

A variant is `bf16` plus steps joined by `+`, each one change:

- `bf16`: the example as it builds the model by default: `--dropout`
  0.1, KerasHub's GPT2Backbone default, with which Keras's
  `MultiHeadAttention` computes attention unfused (einsum, softmax,
  dropout, einsum; pinned softmax in float32): no
  `ops.dot_product_attention`, no flash kernel.
- `nodrop`: `dropout=0` (the example's `--dropout=0`), flash attention
  off (`ops.dot_product_attention` through XLA): what dropping dropout
  alone buys. The example at `--dropout=0` leaves the choice to Keras
  (flash where its cuDNN check passes), which no variant here times.
- `flash`: `dropout=0` and flash attention forced on each attention
  layer: cuDNN's fused attention on a GPU (`__cudnn$fmha*` custom calls),
  the boolean causal-and-padding mask passed as a bias, and since
  2026-11-29 `is_causal` beside it (`kmp.pin_float32`'s
  `kmp.islands.attend_causally`: cuDNN's causal mask type, which skips
  the blocks above the diagonal). On a CPU it stays XLA's (there is no
  cuDNN).
- `causal`: attention gets `is_causal=True` and no mask (the padding
  mask here is all ones): cuDNN's causal mask type, no bias and no
  bias gradient.
- `hubpos`: KerasHub's position embedding called as KerasHub writes it
  (its table broadcast to the batch, the table's gradient a sum over the
  batch), undoing what `kmp.pin_float32` does to it
  (`kmp.islands.broadcast_once`, one example's embedding repeated, in 16
  bits from a batch of 32 as a product with ones): what that buys. At a
  batch of 32 and more XLA lays the activations out batch-innermost for
  the sum on a GPU.
- `hubgelu`: the feed-forward GELU differentiated as Keras writes it
  (its inner `tanh` kept for the backward pass), undoing what
  `kmp.pin_float32` does to it (`kmp.islands.recompute_gelu`, the GELU
  recomputed from its input in the backward pass, which lets XLA fuse
  the bias and the GELU into the matmul's cuBLASLt epilogue): what that
  buys.
- `hubbias`: the attention's query, key and value projections add their
  `(heads, head_dim)` bias as Keras writes it, undoing what
  `kmp.pin_float32` does to them (`kmp.islands.flatten_bias`, the bias
  added on the flat output, which XLA fuses into the matmul's cuBLASLt
  `BIAS` epilogue): what that buys.
- `hubcausal`: the decoder's self-attention given its mask alone, as
  KerasHub writes it, undoing what `kmp.pin_float32` does
  (`kmp.islands.attend_causally`): cuDNN then computes every block of
  the scores and masks them (the `flash` step as measured until
  2026-11-28).
- `kmp.float8`: `kmp.float8(model, matmul="kmp", min_size=0)`, kmp's
  own float8 matmul in every eligible layer; `keras.float8`: the same
  with `matmul="keras"`, Keras's float8 layers.

Model FLOPs per token (PaLM, appendix B): 6 * N + 12 * L * T * d, with N
the matmul parameters (12 * d^2 per decoder block, and the tied logits
matmul, vocabulary * d; embeddings lookups and biases not counted), L
layers, T the sequence length, d the width; the attention term counts
the full T x T scores, as PaLM does, though half are masked
(`kmp.app.flops.causal_lm_flops_per_token`: the count the example's
results.json and `kmp bench` use too). MFU is that count's TFLOP/s over
the device's dense 16-bit peak (`kmp.app.flops.peak_tflops`); none on a
CPU. The lowered train step (StableHLO, not compiled again) is searched
for cuDNN's fused attention custom calls and float8 `dot_general`s, to
show which path ran; XLA's cuBLASLt float8 GEMMs appear only after
compilation and are not counted.

Free of TensorFlow and grain: numpy arrays through Keras's own `fit`
(KerasHub's `fit` wraps arrays in tf.data or grain), JAX backend.
"""

import argparse
import dataclasses
import gc
import os
import statistics
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Several models live at once (the variants are interleaved): JAX's
# default 75 % preallocation would leave a quarter of the GPU unused.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")

import common  # noqa: E402
import jax  # noqa: E402
import keras  # noqa: E402
from keras import ops  # noqa: E402

import kmp  # noqa: E402
from kmp import backend  # noqa: E402
from kmp.app import flops  # noqa: E402
from kmp.app import report  # noqa: E402
from kmp.examples import lm  # noqa: E402

POLICY = "mixed_bfloat16"
STEPS = (
    "nodrop",
    "flash",
    "causal",
    "hubpos",
    "hubgelu",
    "hubbias",
    "hubcausal",
    "kmp.float8",
    "keras.float8",
)
DEFAULT_VARIANTS = (
    "bf16,bf16+flash,bf16+flash+causal,bf16+flash+causal+kmp.float8,"
    "bf16+flash+causal+keras.float8"
)
# hidden x layers, batch, sequence length. gpu: a step of roughly
# 0.1-0.7 s on an H200 at today's MFU; several variants of 2048 x 24
# (1.2 B matmul parameters, 16 bytes each with AdamW) fit its memory.
SIZES = {
    "gpu": {"configs": "1024x16,2048x24", "batch_size": 0, "sequence": 512},
    "small": {"configs": "64x2", "batch_size": 4, "sequence": 64},
}
GPU_BATCH = {1024: 32, 2048: 16}


def parse_variant(name):
    """The set of steps in `name` ("bf16+flash+causal"); raises on
    anything else."""
    parts = name.split("+")
    if parts[0] != "bf16" or any(p not in STEPS for p in parts[1:]):
        raise ValueError(
            f"Unknown variant {name!r}: expected 'bf16' followed by "
            f"'+'-joined steps from {STEPS}, e.g. 'bf16+flash+causal'."
        )
    steps = set(parts[1:])
    if "kmp.float8" in steps and "keras.float8" in steps:
        raise ValueError(f"{name!r}: choose kmp.float8 or keras.float8.")
    return steps


def parse_config(text, heads):
    """`"1024x16"` -> (hidden_dim, layers, heads)."""
    try:
        hidden, layers = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(
            f"--configs takes HIDDENxLAYERS items like 1024x16, got {text!r}."
        ) from None
    return hidden, layers, heads or max(hidden // 128, 1)


def _causal_attention(layer):
    """`layer._compute_attention` with `is_causal=True` and no mask, what
    Keras's own MultiHeadAttention does when causality is its only mask
    (KerasHub's cached subclass always passes a mask)."""

    def compute(
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        **kwargs,
    ):
        del attention_mask, training, kwargs  # all-ones padding here
        if return_attention_scores:
            raise ValueError("The causal variant returns no scores.")
        output = ops.dot_product_attention(
            query,
            key,
            value,
            scale=layer._inverse_sqrt_key_dim,
            is_causal=True,
            flash_attention=layer._flash_attention,
        )
        return output, None

    return compute


def flash_check(config):
    """None if Keras's own test lets cuDNN flash attention run on this
    model's query shape in bfloat16, else why not."""
    from keras.src.backend.jax.nn import _can_use_flash_attention

    shape = (1, config.sequence_length, config.heads)
    q = jax.numpy.zeros(shape + (config.hidden_dim // config.heads,))
    q = q.astype("bfloat16")
    try:
        _can_use_flash_attention(q, q, q, None, raise_error=True)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


def set_attention(model, steps, config):
    """Sets each attention layer's flash flag (a private attribute: the
    GPT-2 constructor has no `flash_attention` argument) and, for
    `causal`, its attention function. Returns the flag set."""
    if "flash" in steps:
        # Forced on where Keras's check passes (so a silent fallback to
        # XLA cannot pass for flash); elsewhere (a CPU, or a JAX whose
        # cuDNN check fails) left to Keras's auto choice, which is XLA.
        why_not = flash_check(config)
        flag = True if why_not is None else f"auto ({why_not[:200]})"
    elif "nodrop" in steps:
        flag = False
    elif "causal" in steps:
        flag = None  # Keras's auto choice
    else:
        return "unfused (dropout > 0)"
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.MultiHeadAttention):
            layer._flash_attention = flag if flag in (True, False) else None
            if "causal" in steps:
                layer._compute_attention = _causal_attention(layer)
    return flag


def compile_variant(config, steps, total_steps):
    """The model as `lm.compile_model` makes it (pinned, AdamW under
    `kmp.wrap`, the example's loss and metric), with `steps` applied."""
    if steps & {"nodrop", "flash", "causal"}:
        config = dataclasses.replace(config, dropout=0.0)  # `--dropout=0`
    model = kmp.pin_float32(lm.build_model(config))
    # Undone: the instance's own call goes, the class's (KerasHub's
    # position embedding, the GELU as written, the bias as written, the
    # decoder's mask alone) is back. A projection with both wrappers keeps
    # the one not undone.
    undo = []
    if "hubpos" in steps:
        undo.append(kmp.islands.broadcasts_once)
    if "hubgelu" in steps:
        undo.append(kmp.islands.recomputes_gelu)
    if "hubbias" in steps:
        undo.append(kmp.islands.flattens_bias)
    if "hubcausal" in steps:
        undo.append(kmp.islands.attends_causally)
    for layer in model._flatten_layers():
        if any(applied(layer) for applied in undo):
            gelu = kmp.islands.recomputes_gelu(layer)
            bias = kmp.islands.flattens_bias(layer)
            del layer.call
            if bias and kmp.islands.flattens_bias not in undo:
                kmp.islands.flatten_bias(layer)
            if gelu and kmp.islands.recomputes_gelu not in undo:
                kmp.islands.recompute_gelu(layer)
    flash = set_attention(model, steps, config)
    # Every eligible layer (min_size=0): what float8 costs or buys in
    # each kernel, not kmp.float8's device-read default.
    if "kmp.float8" in steps:
        kmp.float8(model, matmul="kmp", min_size=0)
    elif "keras.float8" in steps:
        kmp.float8(model, matmul="keras", min_size=0)
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0,
        decay_steps=max(total_steps, 1),
        warmup_target=config.learning_rate,
        warmup_steps=max(total_steps // 10, 1),
    )
    optimizer = kmp.wrap(
        keras.optimizers.AdamW(schedule, weight_decay=0.1),
        state_dtype=config.optimizer_states,
        seed=config.seed,
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[
            keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        ],
    )
    with backend.initialized_together():
        model.optimizer.build(model.trainable_variables)
    return model, flash


def train_state(model):
    """The state Keras's JAX `train_step` takes (a private method of the
    JAX trainer: what `fit` passes it)."""
    return model._get_jax_state(
        trainable_variables=True,
        non_trainable_variables=True,
        optimizer_variables=True,
        metrics_variables=True,
    )


def hlo_counts(model, x, y, batch):
    """Fused-attention custom calls and float8 dot_generals in the
    lowered train step (traced again, not compiled)."""
    state = train_state(model)
    data = (
        {k: jax.numpy.asarray(v[:batch]) for k, v in x.items()},
        jax.numpy.asarray(y[:batch]),
    )
    text = jax.jit(model.train_step).lower(state, data).as_text()
    lines = text.splitlines()
    return {
        "cudnn_fmha_calls": sum("__cudnn$fmha" in line for line in lines),
        "float8_dot_generals": sum(
            "dot_general" in line and "f8E" in line for line in lines
        ),
    }


def measure_size(args, config_text, peak, device, records, out):
    hidden, layers, heads = parse_config(config_text, args.heads)
    batch = args.batch_size or GPU_BATCH.get(hidden, 16)
    config = lm.Config(
        hidden_dim=hidden,
        heads=heads,
        layers=layers,
        sequence_length=args.sequence_length,
        batch_size=batch,
        data="synthetic",
    )
    count = batch * args.steps
    x, y = lm.windows(
        lm.synthetic_text(count * args.sequence_length + 1, 0),
        args.sequence_length,
    )
    per_token = flops.causal_lm_flops_per_token(
        layers, hidden, args.sequence_length, lm.VOCABULARY
    )
    tokens = batch * args.sequence_length
    models, runs, rows, step_logs = {}, {}, {}, {}
    for name in args.variants.split(","):
        record = {
            "config": config_text,
            "variant": name,
            "hidden_dim": hidden,
            "layers": layers,
            "heads": heads,
            "sequence_length": args.sequence_length,
            "batch_size": batch,
            "steps_per_epoch": args.steps,
            "flops_per_token": per_token,
        }
        records.append(record)
        rows[name] = record
        try:
            steps = parse_variant(name)
            start = time.perf_counter()
            with kmp.policy_scope(POLICY):
                keras.utils.set_random_seed(0)
                model, flash = compile_variant(
                    config, steps, (args.rounds + 2) * args.steps
                )
            record["flash_attention_flag"] = flash
            if name == args.variants.split(",")[0]:
                record["params"] = model.count_params()
                # What `kmp bench` counts for the model: the same
                # count, read from the backbone's sizes (a cross-check).
                try:
                    counted = flops.training_flops(model)
                    record["kmp_training_flops_per_token"] = (
                        counted / args.sequence_length if counted else None
                    )
                except Exception as error:
                    record["kmp_training_flops_per_token"] = repr(error)

            step_log = report.StepLog()

            def run(model=model, step_log=step_log):
                # Keras's fit, not KerasHub's override: that one turns
                # arrays into a tf.data or grain dataset (neither is on
                # the GPU machine; and feeding arrays costs less).
                return keras.Model.fit(
                    model,
                    x,
                    y,
                    batch_size=batch,
                    epochs=1,
                    verbose=0,
                    shuffle=False,
                    callbacks=[step_log],
                ).history["loss"][-1]

            record["loss_first"] = run()  # compiles
            record["build_and_first_epoch_s"] = time.perf_counter() - start
            # Alone: one round, timed as the interleaved rounds are.
            solo_losses = []
            calls, steady = common.time_fit_rounds(
                {name: lambda losses=solo_losses: losses.append(run())},
                {name: step_log},
                1,
                args.steps,
            )
            record["loss_solo"] = solo_losses[0]
            record["solo_call_step_time_s"] = calls[name][0] / args.steps
            solo = record["solo_step_time_s"] = steady[name][0]
            record["solo_mfu"] = (
                per_token * tokens / solo / 1e12 / peak if peak else None
            )
            models[name], runs[name], step_logs[name] = model, run, step_log
            print(
                f"{config_text} {name}: first epoch "
                f"{record['build_and_first_epoch_s']:.1f}s (with compile), "
                f"step {1000 * solo:.1f} ms alone",
                flush=True,
            )
        except Exception as error:
            record["error"] = f"{type(error).__name__}: {error}"
            record["traceback"] = traceback.format_exc()[-3000:]
            print(f"{config_text} {name}: {record['error']}", flush=True)
        write(args, device, peak, records, out)
    if runs:
        seconds, steady = common.time_fit_rounds(
            runs, step_logs, args.rounds, args.steps
        )
        for name, epochs in seconds.items():
            step = statistics.median(steady[name])
            achieved = per_token * tokens / step / 1e12
            rows[name].update(
                step_time_s=step,
                tokens_per_s=tokens / step,
                model_tflops=achieved,
                mfu=achieved / peak if peak else None,
                epoch_seconds=epochs,
                steady_step_seconds=steady[name],
                call_step_time_s=statistics.median(epochs) / args.steps,
            )
    write(args, device, peak, records, out)
    for name, model in models.items():
        if not args.hlo:
            break
        try:
            rows[name].update(hlo_counts(model, x, y, batch))
        except Exception as error:
            rows[name]["hlo"] = f"{type(error).__name__}: {error}"
    base = rows[args.variants.split(",")[0]].get("step_time_s")
    for name in runs:
        if base:
            rows[name]["speed_vs_first"] = base / rows[name]["step_time_s"]
    write(args, device, peak, records, out)
    del models, runs
    keras.backend.clear_session()
    gc.collect()


def write(args, device, peak, records, out):
    common.write_result(
        {
            "benchmark": "lm_speed",
            "device_kind": device,
            "peak_tflops": peak,
            "policy": POLICY,
            "flops": "6 N + 12 L T d per token (PaLM appendix B)",
            "runs": records,
        },
        f"lm_speed_{args.size}_{backend.name()}.json",
        out,
    )


def table(records):
    lines = [
        "| config | variant | step (ms) | tokens/s | TFLOP/s | MFU | "
        "vs first | fmha calls | f8 dots | loss |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if "step_time_s" not in r:
            lines.append(
                f"| {r['config']} | {r['variant']} | "
                f"{r.get('error', 'not timed')[:120]} |||||||| "
            )
            continue
        mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else "-"
        lines.append(
            f"| {r['config']} | {r['variant']} | "
            f"{1000 * r['step_time_s']:.1f} | {r['tokens_per_s']:.0f} | "
            f"{r['model_tflops']:.3g} | {mfu} | "
            f"{r.get('speed_vs_first', float('nan')):.2f}x | "
            f"{r.get('cudnn_fmha_calls', '-')} | "
            f"{r.get('float8_dot_generals', '-')} | "
            f"{r['loss_solo']:.4f} |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="gpu")
    parser.add_argument(
        "--configs", default=None, help="HIDDENxLAYERS,... (e.g. 1024x16)"
    )
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--heads", type=int, default=0, help="0: hidden/128")
    parser.add_argument("--sequence_length", type=int, default=0)
    parser.add_argument("--batch_size", type=int, default=0)
    parser.add_argument("--steps", type=int, default=5, help="per epoch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--hlo", type=int, default=1, help="1: count fused calls"
    )
    parser.add_argument("--out", default=None, help="JSON path")
    args = parser.parse_args()
    size = SIZES[args.size]
    args.configs = args.configs or size["configs"]
    args.sequence_length = args.sequence_length or size["sequence"]
    args.batch_size = args.batch_size or size["batch_size"]
    for name in args.variants.split(","):
        parse_variant(name)  # a typo fails before any compile
    if backend.name() != "jax":
        raise SystemExit(
            "lm_speed.py measures the JAX backend: KERAS_BACKEND=jax."
        )
    device = jax.devices()[0].device_kind
    peak = flops.peak_tflops(device, POLICY, tf32=None)
    records = []
    for config_text in args.configs.split(","):
        measure_size(args, config_text, peak, device, records, args.out)
    print(table(records))


if __name__ == "__main__":
    main()
