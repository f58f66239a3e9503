"""# IMDB sentiment with kmp mixed precision

A small Transformer encoder (token and position embeddings, multi-head
self-attention, feed-forward blocks) classifies TFDS `imdb_reviews` as
positive or negative, with float16 (or bfloat16) compute, float32
variables, kmp's dynamic loss scale, and `kmp.pin_float32` keeping the
attention softmax and the output in float32 while the matmuls around
them stay in half precision. `--model=bilstm` trains a BiLSTM instead.

Run (from the repository root, after `pip install -e .`):

    python examples/imdb.py --epochs=3                  # policy "auto"
    python examples/imdb.py --policy=float32 --steps=50 --epochs=1
    python examples/imdb.py --data=synthetic            # no download
    python examples/imdb.py --policy=mixed_bfloat16 --float8  # H100/H200
    kmp train imdb --steps=20                           # the same code
    kmp doctor imdb --data=synthetic                    # numerics check

`--strategy=mirrored|multiworker` (TensorFlow) and
`--distribution=data|model` (JAX) as in examples/cifar10.py; under
`model`, each attention's heads and each feed-forward layer's hidden
units are split over the devices (`layout_map`).

Measured (2-core AMD EPYC VM, no GPU; TF 2.21, Keras 3.15.1,
2026-11-23) with `python benchmarks/parity.py` (d_model 64, sequence 128,
2 epochs, batch 32, 4,000 synthetic reviews, 10% of their labels
redrawn, so about 95% is the ceiling): test accuracy 0.9513 (float32),
0.9475 (mixed_float16), 0.9475 (mixed_bfloat16). Speed claims belong to
GPUs: on one H100 (Keras 3.15.1 on JAX, 2026-11-25; BENCHMARKS.md)
`kmp bench --size full` trained this encoder (d_model 512, sequence 256,
batch 64) 1.63x as fast in mixed_float16 as in float32, 1.69x in
mixed_bfloat16.
"""

import os

if __name__ == "__main__":
    # Before TensorFlow loads: its C++ logs (on a CPU machine among them
    # "failed call to cuInit", which is not a failure) would bury the
    # run's own lines. Errors still reach Python as exceptions; a value you
    # set yourself (TF_CPP_MIN_LOG_LEVEL=0 shows everything) stands.
    # `kmp train` also filters the lines TensorFlow prints while loading.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import dataclasses

import keras

import kmp
from kmp import backend
from kmp.app import data as kmp_data
from kmp.app.feeding import Feeding
from kmp.app.run import Run
from kmp_config import configs

# ## Configuration
#
# `Config` holds a run's settings, and each field is a flag
# (`--help` lists them): those every example takes (policy, epochs,
# batch_size, steps, data, seed, strategy, output_dir, restart, ...) and
# this model's: model, d_model, heads, layers, sequence_length,
# vocabulary_size, float8. Where no GPU is found, the sizes not given are
# batch 32, d_model 64, sequence 128, and the run says so. The class is in
# kmp_config/configs.py, which imports no Keras, so that `kmp train` refuses
# a bad flag (`--heads` that do not divide `--d_model` too) before
# TensorFlow loads; it also holds what `kmp bench` times (`BENCH_SIZES`)
# and the kernels `--distribution=model` splits (`LAYOUT`: each
# attention's heads, each feed-forward layer's hidden units).

Config = configs.ImdbConfig


# ## Data
#
# TFDS's imdb_reviews (25,000 training and 25,000 test reviews) when it is
# on disk or downloadable, tokenized by a `TextVectorization` layer fitted
# on the training text; otherwise (with `--data=auto`) synthetic reviews
# that are already token ids, labelled as such.


def load_data(config):
    def synthetic():
        return kmp_data.synthetic_text(
            train_size=config.synthetic_size,
            test_size=max(config.synthetic_size // 5, 1),
            sequence_length=config.sequence_length,
            vocabulary_size=config.vocabulary_size,
            seed=config.seed,
        )

    return kmp_data.load(
        "imdb_reviews", config.data, synthetic, config.data_dir or None
    )


def make_datasets(splits, config):
    """Full batches of token ids (training drops its last partial batch,
    validation pads its own with zero-weight rows, so each step compiles
    once): on device on JAX when the reviews are arrays (synthetic), else
    `tf.data` pipelines when TensorFlow is installed, else NumPy
    arrays."""
    feeding = Feeding(config, splits)
    tokenize = splits.source == "tfds"  # strings, for tf.data below
    if feeding.kind == "device" and not tokenize:
        train = feeding.on_device(splits.train, training=True)
        return train, feeding.on_device(splits.test)
    if feeding.kind == "arrays":
        return feeding.full_batches(splits.train), feeding.padded(splits.test)
    import tensorflow as tf

    train, test = splits.train, splits.test
    if tokenize:
        vectorize = keras.layers.TextVectorization(
            max_tokens=config.vocabulary_size,
            output_sequence_length=config.sequence_length,
        )
        texts = train.map(lambda text, label: text)
        vectorize.adapt(texts.take(10_000).batch(512))

        def tokens(text, label):
            return vectorize(text), label

        train = train.map(tokens, num_parallel_calls=tf.data.AUTOTUNE)
        test = test.map(tokens, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        train = tf.data.Dataset.from_tensor_slices(train)
        test = tf.data.Dataset.from_tensor_slices(test)
    # Epoch k's order depends on (seed, k) alone (`Feeding`).
    train = feeding.batches(train.cache(), shuffle=25_000)
    test = feeding.padded(test)
    return train, test.cache().prefetch(tf.data.AUTOTUNE)


# ## Model
#
# The Transformer encoder of the keras-io text-classification example:
# post-norm blocks of self-attention and a ReLU feed-forward layer, mean
# pooling, a softmax. `kmp.pin_float32` computes each attention softmax
# and the output softmax in float32.


def encoder_block(x, d_model, heads, dropout=0.1, index=0):
    attention = keras.layers.MultiHeadAttention(
        heads,
        key_dim=d_model // heads,
        dropout=dropout,
        name=f"attention_{index}",
    )(x, x)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(
        x + keras.layers.Dropout(dropout)(attention)
    )
    forward = keras.layers.Dense(
        4 * d_model, activation="relu", name=f"ffn_up_{index}"
    )(x)
    forward = keras.layers.Dense(d_model, name=f"ffn_down_{index}")(forward)
    return keras.layers.LayerNormalization(epsilon=1e-6)(
        x + keras.layers.Dropout(dropout)(forward)
    )


def build_model(config):
    inputs = keras.Input((config.sequence_length,), dtype="int32")
    if config.model == "bilstm":
        x = keras.layers.Embedding(config.vocabulary_size, config.d_model)(
            inputs
        )
        x = keras.layers.Bidirectional(keras.layers.LSTM(config.d_model))(x)
    else:
        x = kmp.layers.TokenAndPositionEmbedding(
            config.sequence_length, config.vocabulary_size, config.d_model
        )(inputs)
        for index in range(config.layers):
            x = encoder_block(x, config.d_model, config.heads, index=index)
        x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dropout(0.1)(x)
    outputs = keras.layers.Dense(2, activation="softmax")(x)
    return keras.Model(inputs, outputs, name=f"imdb_{config.model}")


def compile_model(config, steps):
    """The model with its float32 islands, compiled with AdamW under
    `kmp.wrap` (dynamic loss scale) and a warm-up + cosine schedule over
    `config.epochs * steps` steps, in the current dtype policy."""
    # On JAX every weight's first value comes from one compiled program,
    # not one per shape: a cold start compiles less (kmp.backend).
    with backend.initialized_together():
        model = build_model(config)
    model = kmp.pin_float32(model)
    if config.float8:
        kmp.float8(model)  # after pinning: the softmaxes stay float32
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0,
        decay_steps=max(config.epochs * steps, 1),
        warmup_target=config.learning_rate,
        warmup_steps=max(config.epochs * steps // 10, 1),
    )
    optimizer = kmp.wrap(
        keras.optimizers.AdamW(schedule, weight_decay=0.01),
        state_dtype=config.optimizer_states,  # and seed: examples/lm.py
        seed=config.seed,
    )
    model.compile(
        optimizer=optimizer,
        loss="sparse_categorical_crossentropy",
        # Weighted: validation pads its last batch with rows of weight 0.
        # An instance, not "accuracy": its variables exist now (Keras on
        # TensorFlow resolves a name inside the first trace of the train
        # step, and a trace that creates variables is traced again).
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
# As for CIFAR-10 (examples/cifar10.py says what each line does):
# `kmp.enable` before the model is built, a `Run` around the data, the
# model and `fit`.


def train(config: Config) -> dict:
    """Trains and evaluates; returns the results (also written as JSON)."""
    with Run(config) as run:
        kmp.enable(config.policy, master_weights=config.master_weights)
        splits = load_data(config)
        train_data, test_data = make_datasets(splits, config)
        steps = run.start(splits)  # a rerun resumes from the backup
        with run.scope():
            model = compile_model(config, steps)
        model = run.distribute(model)  # kmp.distribute under a strategy
        history = model.fit(
            **run.data(train_data, test_data),
            epochs=config.epochs,
            steps_per_epoch=steps,  # the data is one stream (Feeding)
            callbacks=run.callbacks,
            verbose=config.verbose,
        )
        return run.finish(model, history, f"imdb_{config.model}")


# ## Results
#
# As for CIFAR-10: a table and a summary line; results.json, results.png
# and the model in --output_dir, each path printed.


# ## For `kmp bench` and `kmp doctor`
#
# What the commands read besides `train` and `compile_model`
# (kmp.app.protocol): the inputs `kmp bench` feeds (its sizes, float8
# variants and optimizer are the config's).


def bench_inputs(config, count):
    """For `kmp bench`: the encoder at `--d_model` (a head per 64 of it)
    and `--sequence_length`, pinned, and `count` synthetic reviews."""
    config = dataclasses.replace(config, heads=max(config.d_model // 64, 1))
    (x, y), _ = kmp_data.synthetic_text(count, 1, config.sequence_length)
    return kmp.pin_float32(build_model(config)), x, y


if __name__ == "__main__":
    import sys

    from kmp.app.run import main

    main(sys.modules[__name__])  # the flags, train, the table, the files
