"""One worker of a 2-process MultiWorkerMirroredStrategy job on 127.0.0.1.

    python tests/distributed/workers.py SCENARIO INDEX PORT0 PORT1 [WORKDIR]

Scenarios (each prints one `RESULT {json}` line):

- `fit`: stock `model.fit` fails (the Keras defect), then after
  `kmp.distribute` a small mixed-float16 convnet trains with validation,
  LossScaleMonitor, ModelCheckpoint and kmp's BackupAndRestore (which
  Keras's resumes); then evaluate, predict, and a batch size that does
  not split over the replicas.
- `overflow`: worker 1's first batch overflows float16; both must skip,
  whichever optimizer was compiled (`OPTIMIZERS`; Keras's own scaler
  used to hang both workers here). `overflow KIND` tries one only.
- `shard`: records which examples each worker trains on, per epoch.
- `lost kill|stop`: at its 5th step worker 1 kills (SIGKILL) or freezes
  (SIGSTOP) itself; worker 0 must end with an error, not wait forever.
- `all`: `fit`, `overflow` and `shard` one after another under one
  strategy (each builds its own models), reported as one dict: the tests
  pay for one cluster start instead of three.

A helper for tests/distributed/multi_worker_test.py, which starts the
processes.
"""

import hashlib
import json
import os
import shutil
import signal
import sys
import time

SCENARIO, INDEX = sys.argv[1], int(sys.argv[2])
PORTS = sys.argv[3:5]
WORKDIR = sys.argv[5] if len(sys.argv) > 5 else None
os.environ["TF_CONFIG"] = json.dumps(
    {
        "cluster": {"worker": [f"127.0.0.1:{port}" for port in PORTS]},
        "task": {"type": "worker", "index": INDEX},
    }
)
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# tests/util.py, one folder up, as pytest's conftest makes it importable.
sys.path.insert(1, os.path.join(os.path.dirname(__file__), os.pardir))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from util import mlp  # noqa: E402

import kmp  # noqa: E402


def report(**result):
    print("RESULT " + json.dumps(result), flush=True)
    return result


STRATEGY = kmp.multi_worker_strategy(timeout=60)
kmp.enable("mixed_float16")


def floats(history):
    return {k: [float(v) for v in vs] for k, vs in history.history.items()}


def digest(model):
    h = hashlib.sha256()
    for weight in model.weights:
        h.update(np.asarray(weight.numpy()).tobytes())
    return h.hexdigest()


def images(n=256, seed=0):
    # A learnable task: the class is the brightest quadrant.
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, size=n)
    x = rng.normal(0, 0.3, size=(n, 8, 8, 3)).astype("float32")
    for i, label in enumerate(y):
        r, c = divmod(int(label), 2)
        x[i, r * 4 : r * 4 + 4, c * 4 : c * 4 + 4] += 1.0
    return x, y.astype("int32")


def convnet():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(4),
            keras.layers.Activation("softmax", dtype="float32"),
        ]
    )


# Every way a user can hand `compile` an optimizer under mixed_float16.
OPTIMIZERS = {
    "kmp": lambda: kmp.wrap(keras.optimizers.SGD(0.1), initial_scale=512),
    "keras": lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=512
    ),
    "plain": lambda: keras.optimizers.SGD(0.1),  # Keras wraps it itself
    "name": lambda: "sgd",  # likewise
}


def compiled(make_model, optimizer="kmp", **kwargs):
    with STRATEGY.scope():
        model = make_model()
        model.compile(
            optimizer=OPTIMIZERS[optimizer](),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            **kwargs,
        )
    return model


def fit():
    x, y = images()
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    val = tf.data.Dataset.from_tensor_slices(images(64, seed=1)).batch(32)
    stock = compiled(convnet)
    try:
        stock.fit(train, epochs=1, verbose=0)
        stock_error = None
    except Exception as error:  # the defect: any error type will do
        stock_error = f"{type(error).__name__}: {str(error)[:200]}"

    model = kmp.distribute(compiled(convnet))
    before = model.evaluate(train, verbose=0, return_dict=True)
    monitor = kmp.callbacks.LossScaleMonitor()
    # Each worker names its own file, so the test sees who wrote.
    checkpoint = os.path.join(WORKDIR, f"worker{INDEX}.keras")
    backup = os.path.join(WORKDIR, "backup")
    history = model.fit(
        train,
        validation_data=val,
        epochs=3,
        verbose=0,
        callbacks=[
            monitor,
            keras.callbacks.ModelCheckpoint(checkpoint),
            # kmp's (whole saves), on the chief only; Keras's resumes it.
            kmp.callbacks.BackupAndRestore(backup, delete_checkpoint=False),
        ],
    )
    after = model.evaluate(train, verbose=0, return_dict=True)
    # A restarted job: a new model resumes from the chief's backup.
    resumed = kmp.distribute(compiled(convnet))
    resumed_history = resumed.fit(
        train,
        epochs=5,
        verbose=0,
        callbacks=[
            keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)
        ],
    )
    # A backup only worker 0 can read (no shared storage): a clear error.
    private = os.path.join(WORKDIR, f"private{INDEX}")
    if INDEX == 0:
        shutil.copytree(backup, private)
    try:
        resumed.fit(
            train,
            epochs=6,
            verbose=0,
            callbacks=[keras.callbacks.BackupAndRestore(private)],
        )
        private_backup = None
    except ValueError as error:
        private_backup = str(error)
    predictions = model.predict(val, verbose=0)
    try:
        model.fit(x, y, batch_size=33, epochs=1, verbose=0)
        odd_batch = None
    except ValueError as error:
        odd_batch = str(error)
    return report(
        stock_error=stock_error,
        digest=digest(model),
        scale=float(model.optimizer.loss_scale.numpy()),
        skipped=int(model.optimizer.skipped_steps.numpy()),
        history=floats(history),
        before=before,
        after=after,
        predictions=list(predictions.shape),
        files=sorted(os.listdir(WORKDIR)),
        backup=sorted(os.listdir(backup)) if os.path.isdir(backup) else [],
        odd_batch=odd_batch,
        resumed_epochs=len(resumed_history.history["loss"]),
        resumed_digest=digest(resumed),
        private_backup=private_backup,
    )


def overflow(kinds=tuple(OPTIMIZERS)):
    def per_worker(context):
        x, y = images(64)
        if context.input_pipeline_id == 1:
            x[0, 0, 0, 0] = 1e9  # inf once cast to float16
        batch = context.get_per_replica_batch_size(32)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)

    data = STRATEGY.distribute_datasets_from_function(per_worker)
    results = {}
    for kind in kinds:
        model = kmp.distribute(compiled(convnet, kind))
        model.fit(data, epochs=1, steps_per_epoch=1, verbose=0)
        results[kind] = dict(
            optimizer=type(model.optimizer).__module__,
            digest=digest(model),
            initial=digest(kmp.distribute(compiled(convnet, kind))),
            scale=float(model.optimizer.loss_scale.numpy()),
            skipped=int(model.optimizer.skipped_steps.numpy()),
        )
    return report(**results)


def shard():
    n = 96
    seen = []

    def record(ids):
        seen.extend(int(i) for i in ids.numpy())
        return 0

    x = np.stack([np.arange(n), np.zeros(n)], axis=1).astype("float32")
    y = np.zeros(n, dtype="int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=1)
    model = kmp.distribute(compiled(lambda: mlp(features=2), jit_compile=False))
    original = model.train_step

    def train_step(batch):
        tf.py_function(record, [batch[0][:, 0]], tf.int32)
        return original(batch)

    model.train_step = train_step
    # Each worker its own random state, as in a job nobody seeded.
    tf.random.set_seed(int.from_bytes(os.urandom(3), "big"))
    seen_per_epoch = {"dataset": [], "arrays": []}
    for _ in range(2):
        seen.clear()
        model.fit(data.batch(16), epochs=1, verbose=0)
        seen_per_epoch["dataset"].append(sorted(seen))
        seen.clear()
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        seen_per_epoch["arrays"].append(sorted(seen))
    return report(**seen_per_epoch)


def lost(how):
    """Worker 1 dies or freezes mid-fit; worker 0 reports how fit ended."""
    x, y = images(64)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
    model = kmp.distribute(compiled(convnet))
    last_step = [time.monotonic()]

    class Lose(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            last_step[0] = time.monotonic()
            if INDEX == 1 and batch == 4:
                os.kill(
                    os.getpid(),
                    {"kill": signal.SIGKILL}.get(how, signal.SIGSTOP),
                )

    try:
        model.fit(
            data, epochs=1, steps_per_epoch=10**6, verbose=0, callbacks=[Lose()]
        )
        return report(error=None)
    except Exception as error:  # whatever TensorFlow raises
        return report(
            error=type(error).__name__,
            message=str(error).splitlines()[0][:200],
            seconds=time.monotonic() - last_step[0],
        )


SCENARIOS = {"fit": fit, "overflow": overflow, "shard": shard}
if SCENARIO == "all":
    # `shard` last: it replaces a train step and reseeds TensorFlow.
    report(**{name: run() for name, run in SCENARIOS.items()})
elif SCENARIO == "overflow" and WORKDIR in OPTIMIZERS:
    overflow([WORKDIR])  # the argument after the ports names the kind
elif SCENARIO == "lost":
    lost(WORKDIR)  # the argument after the ports: kill or stop
else:
    SCENARIOS[SCENARIO]()
