"""Runs multi-replica scenarios on 2 logical CPUs and prints JSON.

    python tests/replicas.py one_inf kmp|stock BAD_REPLICA
    python tests/replicas.py clip kmp|stock
    python tests/replicas.py tf_keras_loop
    python tests/replicas.py fit
    python tests/replicas.py distribute_stock
    python tests/replicas.py float8_fit
    python tests/replicas.py keras_float8 kmp|stock
    python tests/replicas.py bfloat16_masters
    python tests/replicas.py int8_state
    python tests/replicas.py all     # every scenario the tests read

A helper for tests/replicas_test.py: logical devices must be set before
TensorFlow initialises, so the scenarios run in a process of their own;
`all` runs them one after another in one process (each builds its own
variables and optimizer), so the tests pay for one TensorFlow start.
"""

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from util import classification_data  # noqa: E402
from util import mlp  # noqa: E402

import kmp  # noqa: E402

STRATEGY = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def per_replica(variable):
    return [
        np.asarray(v).tolist()
        for v in STRATEGY.experimental_local_results(variable.value)
    ]


def _scaler(kind, initial, inner, initial_scale):
    """A variable and a built `kind` ("kmp" or "stock") scaler, mirrored."""
    cls = {
        "kmp": kmp.LossScaleOptimizer,
        "stock": keras.optimizers.LossScaleOptimizer,
    }[kind]
    with STRATEGY.scope():
        v = keras.Variable(initial)
        optimizer = cls(inner, initial_scale=initial_scale)
        optimizer.build([v])
    return v, optimizer


def one_inf(kind, bad_replica):
    """Replica `bad_replica` sees an inf gradient; the other a finite one."""
    v, optimizer = _scaler(kind, [1.0, 1.0], keras.optimizers.SGD(1.0), 4)

    @tf.function
    def step():
        def replica_fn():
            context = tf.distribute.get_replica_context()
            bad = tf.equal(context.replica_id_in_sync_group, bad_replica)
            grad = tf.where(bad, [np.inf, 4.0], [4.0, 4.0])
            optimizer.scale_loss(1.0)  # grad stands for a scaled loss's
            optimizer.apply([grad], [v])

        STRATEGY.run(replica_fn)

    step()
    result = {
        "weights": per_replica(v),
        "scale": per_replica(optimizer.dynamic_scale),
    }
    if kind == "kmp":
        result["skipped"] = per_replica(optimizer.skipped_steps)
    return result


def tf_keras_loop():
    """tf-keras style: get_unscaled_gradients, then apply_gradients, in
    each replica's thread."""
    v, optimizer = _scaler("kmp", [1.0, 1.0], keras.optimizers.SGD(1.0), 4)

    @tf.function
    def step():
        def replica_fn():
            with tf.GradientTape() as tape:
                loss = optimizer.get_scaled_loss(tf.reduce_sum(v))
            grads = optimizer.get_unscaled_gradients(tape.gradient(loss, [v]))
            optimizer.apply_gradients(zip(grads, [v]))

        STRATEGY.run(replica_fn)

    step()
    return {"weights": per_replica(v)}


def clip(kind):
    """Replica gradients [3, 0] and [0, 4] under global_clipnorm=1."""
    with STRATEGY.scope():
        inner = keras.optimizers.SGD(1.0, global_clipnorm=1.0)
    v, optimizer = _scaler(kind, [0.0, 0.0], inner, 2)

    @tf.function
    def step():
        def replica_fn():
            context = tf.distribute.get_replica_context()
            first = tf.equal(context.replica_id_in_sync_group, 0)
            grad = tf.where(first, [6.0, 0.0], [0.0, 8.0])  # scaled by 2
            optimizer.scale_loss(1.0)  # grad stands for a scaled loss's
            optimizer.apply([grad], [v])

        STRATEGY.run(replica_fn)

    step()
    return {"weights": per_replica(v)}


def _monitored_fit(model, x, y):
    """3 epochs of `fit` at batch 32 with kmp's `LossScaleMonitor`."""
    return model.fit(
        x,
        y,
        batch_size=32,
        epochs=3,
        verbose=0,
        callbacks=[kmp.callbacks.LossScaleMonitor()],
    )


def fit():
    kmp.enable("mixed_float16")
    x, y = classification_data()
    with STRATEGY.scope():
        model = mlp()
        # 2**30 overflows float16 at first: some steps are skipped.
        optimizer = kmp.wrap(
            keras.optimizers.Adam(1e-2),
            initial_scale=2.0**30,
            max_scale=2.0**30,
        )
        model.compile(
            optimizer=optimizer, loss="sparse_categorical_crossentropy"
        )
    history = _monitored_fit(model, x, y)
    return {
        "history": history.history,
        "scale": per_replica(optimizer.dynamic_scale),
        "skipped": per_replica(optimizer.skipped_steps),
        "weights": [per_replica(w) for w in model.weights],
    }


def float8_fit():
    """kmp.float8 under MirroredStrategy with kmp.distribute, kmp's
    scaler and monitor."""
    kmp.enable("mixed_float16")
    x, y = classification_data(features=32)
    with STRATEGY.scope():
        model = kmp.float8(mlp(features=32, units=32))
        optimizer = kmp.wrap(keras.optimizers.Adam(1e-2))
        model.compile(
            optimizer=optimizer, loss="sparse_categorical_crossentropy"
        )
    kmp.distribute(model)
    history = _monitored_fit(model, x, y)
    return {
        "history": history.history,
        "modes": [
            getattr(layer, "quantization_mode", None) for layer in model.layers
        ],
        "weights": [per_replica(w) for w in model.weights],
    }


def keras_float8(kind):
    """Keras's own float8 layers (model.quantize) under `kind`'s scaler
    and Keras's fit, the replicas' halves of each batch 10x apart: does
    every replica hold the same float8 scales and histories?"""
    kmp.enable("mixed_float16")
    x, y = classification_data(features=32)
    x[: len(x) // 2] *= 10
    cls = {
        "kmp": kmp.LossScaleOptimizer,
        "stock": keras.optimizers.LossScaleOptimizer,
    }[kind]
    with STRATEGY.scope():
        model = mlp(features=32, units=32)
        model.quantize("float8")
        model.compile(
            optimizer=cls(keras.optimizers.Adam(1e-2)),
            loss="sparse_categorical_crossentropy",
        )
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    agree, largest = {}, {}
    for w in model.weights:
        if w.name.endswith(("_scale", "_amax_history")):
            # Named without the model's and layers' numbered names.
            name = f"layer {len(agree) // 6}/{w.name}"
            values = per_replica(w)
            agree[name] = all(v == values[0] for v in values[1:])
            largest[name] = [float(np.max(v)) for v in values]
    return {"agree": agree, "largest": largest}


def distribute_stock():
    """Keras's own scaler (compile wraps "sgd"), then kmp.distribute; one
    step in which only replica 1's half of the batch overflows float16."""
    kmp.enable("mixed_float16")
    x, y = classification_data(n=2)
    x[1, 0] = 1e9  # inf once cast to float16: replica 1's example
    with STRATEGY.scope():
        model = mlp()
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    kmp.distribute(model)
    before = [per_replica(w) for w in model.weights]
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, shuffle=False)
    return {
        "optimizer": type(model.optimizer).__module__,
        "unchanged": [per_replica(w) for w in model.weights] == before,
        "scale": per_replica(model.optimizer.dynamic_scale),
        "skipped": per_replica(model.optimizer.skipped_steps),
    }


def _bfloat16_masters_fit(state_dtype, units):
    """AdamW with weight decay over bfloat16 weights (rounded
    stochastically, decayed in float32), its state in `state_dtype`,
    under MirroredStrategy and Keras's fit: the optimizer, the model's
    trainable weights and fit's history."""
    kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    x, y = classification_data()
    with STRATEGY.scope():
        model = mlp(units=units)
        optimizer = kmp.wrap(
            keras.optimizers.AdamW(1e-2, weight_decay=0.05),
            state_dtype=state_dtype,
        )
        model.compile(
            optimizer=optimizer, loss="sparse_categorical_crossentropy"
        )
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    return optimizer, model.trainable_weights, history.history


def _per_replica_floats(variables):
    """Each variable's value on each replica; numpy has no bfloat16:
    the values as float32."""
    return [
        [
            np.asarray(keras.ops.cast(v, "float32")).tolist()
            for v in STRATEGY.experimental_local_results(w.value)
        ]
        for w in variables
    ]


def bfloat16_masters():
    """bfloat16 weights and bfloat16 AdamW state."""
    optimizer, weights, history = _bfloat16_masters_fit("bfloat16", 16)
    return {
        "history": history,
        "optimizer": type(optimizer).__name__,
        "dtypes": sorted({str(w.dtype) for w in weights}),
        "weights": _per_replica_floats(weights),
    }


def int8_state():
    """bfloat16 weights and AdamW's slots in 8 bits (the 512-element
    kernel's; the smaller ones float32)."""
    optimizer, weights, history = _bfloat16_masters_fit("int8", 64)
    return {
        "history": history,
        "codes": [
            v.path for v in optimizer.variables if v.path.endswith("codes")
        ],
        "variables": _per_replica_floats([*weights, *optimizer.variables]),
    }


# What `all` runs, in order; from `distribute_stock` on, each sets the
# global policy it trains under.
ALL = {
    "one_inf kmp 0": lambda: one_inf("kmp", 0),
    "one_inf kmp 1": lambda: one_inf("kmp", 1),
    "one_inf stock 1": lambda: one_inf("stock", 1),
    "tf_keras_loop": tf_keras_loop,
    "clip kmp": lambda: clip("kmp"),
    "clip stock": lambda: clip("stock"),
    "distribute_stock": distribute_stock,
    "fit": fit,
    "float8_fit": float8_fit,
    "keras_float8 kmp": lambda: keras_float8("kmp"),
    "keras_float8 stock": lambda: keras_float8("stock"),
    "bfloat16_masters": bfloat16_masters,
    "int8_state": int8_state,
}

if __name__ == "__main__":
    scenario = sys.argv[1]
    if scenario == "all":
        out = {name: run() for name, run in ALL.items()}
    elif scenario == "one_inf":
        out = one_inf(sys.argv[2], int(sys.argv[3]))
    elif scenario == "tf_keras_loop":
        out = tf_keras_loop()
    elif scenario == "clip":
        out = clip(sys.argv[2])
    elif scenario == "fit":
        out = fit()
    elif scenario == "float8_fit":
        out = float8_fit()
    elif scenario == "distribute_stock":
        out = distribute_stock()
    elif scenario == "keras_float8":
        out = keras_float8(sys.argv[2])
    elif scenario == "bfloat16_masters":
        out = bfloat16_masters()
    elif scenario == "int8_state":
        out = int8_state()
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    print("RESULT " + json.dumps(out))
