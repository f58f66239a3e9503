"""# A causal language model in bfloat16 and float8 with kmp

KerasHub's GPT-2 (`GPT2CausalLM`), built from a config (sizes as flags,
no preset, no download), learns to predict the next byte of text: the
Python standard library's own source files, which ship with every
Python. It trains under `mixed_bfloat16` with `kmp.pin_float32` (each
attention softmax and the output logits in float32) and, with
`--float8`, `kmp.float8` (every Dense and attention projection of the
decoder blocks in Keras's float8: E4M3 forward, E5M2 gradients). Its
results carry tokens/s, model TFLOP/s with MFU (their share of the
device's peak; none on a CPU) and peak memory, so the same run without
`--float8` beside it says what float8 bought; `benchmarks/lm_float8.py`
runs the two, each in its own process, and writes the comparison.
It trains from random weights, the config's: nothing is fine-tuned (the
file was `finetune_lm.py` until the name said more than it did).

Run (from the repository root, after `pip install -e ".[lm]"`):

    python examples/lm.py --steps=50          # CPU sizes here
    python examples/lm.py --steps=50 --float8
    kmp train lm --float8                              # the same code
    kmp train lm --hidden_dim=1024 --layers=16 --float8  # an H100's size
    kmp train lm --float8 --float8_matmul=keras  # Keras's float8 path
    kmp train lm --optimizer_states=bfloat16 --master_weights=bfloat16 --remat
                                     # half the bytes of weights and state
    kmp train lm --dropout=0         # fused (flash, causal) attention on a GPU

A rerun resumes an interrupted run from --output_dir, as the other
examples do; the model is written as lm.keras (`kmp.load_model` reads it
back pinned and compiled).

Measured: BENCHMARKS.md, "Language model" (2-core CPU: float8 costs
there; on a GPU, unmeasured). Speed claims belong to GPUs.
"""

import os

if __name__ == "__main__":
    # Before TensorFlow loads (see examples/imdb.py).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pathlib
import sysconfig

import keras
import numpy as np

import kmp
from kmp import backend
from kmp.app import data as kmp_data
from kmp.app import flops
from kmp.app.feeding import Feeding
from kmp.app.run import Run
from kmp_config import configs

# ## Configuration
#
# The flags every example takes, and this model's: hidden_dim, heads,
# layers, sequence_length, text_bytes, float8, float8_matmul, remat,
# dropout (KerasHub's 0.1; at 0 Keras fuses attention). The policy defaults to
# mixed_bfloat16 (float8 needs a mixed policy). Where no GPU is found,
# the sizes not given are a 2-layer, 64-wide model on 128-byte sequences.

Config = configs.LmConfig
VOCABULARY = 256  # bytes: no tokenizer to download


# ## Data
#
# Bytes of the standard library's .py files, in sorted order, cut into
# sequences of `sequence_length + 1` bytes: the model reads the first
# `sequence_length` and predicts each next one. The last tenth is the
# test split. `--data=synthetic` generates sequences instead (counting
# patterns with noise), for a machine without the library's sources.


def stdlib_text(size):
    """The first `size` bytes of the standard library's source files."""
    files = sorted(pathlib.Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    chunks, total = [], 0
    for path in files:
        chunks.append(path.read_bytes())
        total += len(chunks[-1])
        if total >= size:
            break
    text = b"".join(chunks)[:size]
    if len(text) < size:
        raise kmp.InputError(
            f"The standard library's sources here hold {len(text)} bytes, "
            f"fewer than --text_bytes={size}; lower it or use "
            "--data=synthetic."
        )
    return np.frombuffer(text, dtype=np.uint8)


def synthetic_text(size, seed):
    """`size` bytes of counting runs (start, stride) with 5% noise: a
    next byte that a model can learn to predict."""
    rng = np.random.default_rng(seed)
    runs = -(-size // 64)
    start = rng.integers(0, VOCABULARY, (runs, 1))
    stride = rng.integers(1, 4, (runs, 1))
    text = ((start + stride * np.arange(64)) % VOCABULARY).ravel()[:size]
    noise = rng.random(size) < 0.05
    text[noise] = rng.integers(0, VOCABULARY, noise.sum())
    return text.astype(np.uint8)


def windows(text, length):
    """Inputs and next-byte targets of consecutive sequences."""
    count = (len(text) - 1) // length
    ids = text[: count * length + 1].astype("int32")
    x = np.lib.stride_tricks.sliding_window_view(ids, length + 1)[::length]
    return {
        "token_ids": x[:, :-1].copy(),
        "padding_mask": np.ones((len(x), length), bool),
    }, x[:, 1:].copy()


def load_data(config):
    size = config.text_bytes + config.text_bytes // 10
    if config.data == "synthetic":
        text = synthetic_text(size, config.seed)
        source, note = "synthetic", "generated counting runs"
    else:
        text = stdlib_text(size)
        source = "python-stdlib"
        note = f"{size} bytes of the standard library's .py files"
    train, test = text[: config.text_bytes], text[config.text_bytes :]
    length = config.sequence_length
    x, y = windows(train, length)
    # Shuffled once, here: every epoch reads this order (make_datasets).
    order = np.random.default_rng(config.seed).permutation(len(y))
    x = {name: value[order] for name, value in x.items()}
    return kmp_data.Splits((x, y[order]), windows(test, length), source, note)


def make_datasets(splits, config):
    """grain datasets of NumPy slices (KerasHub's `fit` takes them on
    every backend, TensorFlow or none): training in the order
    `load_data` drew, of which a resumed run's epoch k is the
    uninterrupted run's; validation's batches once (the loss is per
    token: no padding rows of weight 0). `Feeding.in_order`."""
    feeding = Feeding(config, splits)
    test = feeding.in_order(splits.test, training=False)
    return feeding.in_order(splits.train), test


# ## Model
#
# KerasHub's GPT-2 from its constructor: token and position embeddings,
# pre-norm decoder blocks, logits from the tied embedding. Then kmp's two
# steps: the islands, and float8 when asked (after pinning, so the
# softmaxes stay float32).


def build_model(config):
    try:
        import keras_hub
    except ImportError:
        raise kmp.InputError(
            "The language-model example builds KerasHub's GPT-2: "
            "pip install 'kmp[lm]' (or keras-hub)."
        ) from None
    # On JAX every weight's first value comes from one compiled program,
    # not one per shape: a cold start compiles less (kmp.backend). The
    # task after it: its constructor compiles it, making variables.
    with backend.initialized_together():
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=VOCABULARY,
            num_layers=config.layers,
            num_heads=config.heads,
            hidden_dim=config.hidden_dim,
            intermediate_dim=4 * config.hidden_dim,
            max_sequence_length=config.sequence_length,
            # Above 0, Keras computes attention step by step (einsum,
            # softmax, dropout, einsum): no fused kernel has dropout.
            dropout=config.dropout,
        )
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)


def compile_model(config, steps):
    model = kmp.pin_float32(build_model(config))
    if config.float8:  # Keras's float8 layers, or kmp's matmul in them
        matmul = config.float8_matmul
        kmp.float8(model, matmul=None if matmul == "auto" else matmul)
    if config.remat:
        # Each decoder block keeps only its input for the backward pass
        # and recomputes the rest there, under the policy.
        import keras_hub

        kmp.rematerialize(model, keras_hub.layers.TransformerDecoder)
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0,
        decay_steps=max(config.epochs * steps, 1),
        warmup_target=config.learning_rate,
        warmup_steps=max(config.epochs * steps // 10, 1),
    )
    # Memory: --optimizer_states=bfloat16 stores AdamW's moments in
    # bfloat16; --master_weights=bfloat16 the weights too (`train` enables
    # it), each update rounded stochastically under --seed.
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
    # Built now, not in the first trace of the train step: traced once
    # (examples/cifar10.py says why).
    with backend.initialized_together():
        model.optimizer.build(model.trainable_variables)
    return model


# ## Train
#
# As for the other examples (examples/cifar10.py says what each line
# does): `kmp.enable` before the model is built, a `Run` around the data,
# the model and `fit` (one device, or JAX's data parallelism: no
# strategy, no layout). The record adds tokens/s, model TFLOP/s and MFU
# (PaLM's count of model FLOPs per token, kmp.app.flops) and the float8
# layers.


def train(config: Config) -> dict:
    """Trains and evaluates; returns the results (also written as JSON),
    with tokens/s, model TFLOP/s and MFU beside examples/s."""
    with Run(config) as run:
        kmp.enable(config.policy, master_weights=config.master_weights)
        splits = load_data(config)
        steps = run.start(splits)  # a rerun resumes from the backup
        model = compile_model(config, steps)
        history = model.fit(
            **run.data(*make_datasets(splits, config)),
            epochs=config.epochs,
            steps_per_epoch=steps,  # the data is one stream (Feeding)
            callbacks=run.callbacks,
            verbose=config.verbose,
        )

        def more(results):
            return {
                "tokens_per_s": results["examples_per_s"]
                * config.sequence_length,
                **flops.utilization(model, results),  # mfu: None on a CPU
                "float8_layers": sum(
                    getattr(layer, "quantization_mode", None) == "float8"
                    for layer in model._flatten_layers()
                ),
            }

        name = "gpt2_float8" if config.float8 else "gpt2"
        return run.finish(model, history, name, more=more)


def bench_inputs(config, count):
    """The model, pinned and not compiled, and `count` synthetic
    sequences: what `--batch_size=max` compiles its step for."""
    text = synthetic_text(count * config.sequence_length + 1, config.seed)
    x, y = windows(text, config.sequence_length)
    return kmp.pin_float32(build_model(config)), x, y


if __name__ == "__main__":
    import sys

    from kmp.app.run import main

    main(sys.modules[__name__])  # the flags, train, the table, the files
