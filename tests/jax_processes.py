"""One process of a 2-process JAX job on 127.0.0.1 (CPU collectives over
gloo), each process with 2 virtual CPU devices.

    python tests/jax_processes.py scaler PROCESS_ID PORT
    python tests/jax_processes.py train PROCESS_ID PORT OUTPUT_DIR EPOCHS [STOP]
    python tests/jax_processes.py alone PROCESS_ID PORT
    python tests/jax_processes.py one 0 0 OUTPUT_DIR EPOCHS

`scaler`: a Keras model under kmp's float16 scaler and `DataParallel`
over the 4 devices, each process feeding its own rows
(`scale_out.process_share`); process 1's rows of step 2 hold an inf, so
the global batch overflows and every process must skip that step alike.
`train`: the IMDB example (`--distribution=data`, 2 processes) for
EPOCHS epochs, stopped like a kill after epoch STOP when given (every
process; with STOP negative, process 1 alone dies after epoch -STOP and
process 0 goes on); its backup resumes it. `one`: the same training in
one process of 4 devices, for comparison. `alone`:
`kmp.initialize_processes` waiting 3 s for a peer that never comes.
Prints `RESULT {...}`. A helper for tests/distributed/processes_test.py:
the device count and the runtime must be set before JAX starts, so each
runs in its own process.
"""

import json
import os
import sys
import time

DEVICES = 4 if sys.argv[1] == "one" else 2  # per process
# Added to the suite's flags (conftest: a cheaper LLVM pipeline), not
# in their place.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + f" --xla_force_host_platform_device_count={DEVICES}"
).strip()
os.environ["KERAS_BACKEND"] = "jax"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from util import classification_data  # noqa: E402
from util import interrupt_runs  # noqa: E402
from util import small_imdb_config  # noqa: E402

import kmp  # noqa: E402
from kmp.app import scale_out  # noqa: E402
from kmp.examples import imdb  # noqa: E402


def scaler(process_id, port):
    kmp.initialize_processes(f"127.0.0.1:{port}", 2, process_id, timeout=60)
    keras.utils.set_random_seed(0)  # the same weights on every process
    config = imdb.Config(distribution="data", batch_size=16)
    distribution = scale_out.make_distribution(config)
    kmp.enable("mixed_float16")
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(2, dtype="float32"),
        ]
    )
    model.compile(
        optimizer=kmp.wrap(keras.optimizers.SGD(0.1), initial_scale=2.0**10),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x, y = classification_data(n=64, seed=0)  # the same global data
    x[2 * 16 + 8, 0] = np.inf  # step 2, in process 1's half of the batch
    mine = scale_out.process_share((x, y), 16)
    monitor = kmp.callbacks.LossScaleMonitor()
    model.fit(
        *mine,
        batch_size=scale_out.local_batch_size(16),
        shuffle=False,
        epochs=1,
        callbacks=[monitor],
        verbose=0,
    )
    optimizer = model.optimizer
    return {
        "rows": int(len(mine[1])),
        "first_row": mine[0][0].tolist(),
        "batch_devices": distribution.device_mesh.shape[0],
        "skipped": int(optimizer.skipped_steps),
        "iterations": int(optimizer.iterations),
        "scale": float(optimizer.loss_scale),
        "monitor_scales": [float(s) for s in monitor.history["loss_scale"]],
        "weights": [v.numpy().tolist() for v in model.trainable_variables],
        "finite": all(
            bool(np.isfinite(v.numpy()).all()) for v in model.weights
        ),
    }


def train(process_id, port, output_dir, epochs, stop=None):
    config = small_imdb_config(
        policy="mixed_float16",
        synthetic_size=64,
        epochs=epochs,
        distribution="data",
        coordinator=f"127.0.0.1:{port}" if port else "",
        num_processes=2 if port else 1,
        process_id=process_id,
        # A float, as the flag gives it. It bounds JAX's shutdown
        # barrier too, where process 1 waits while the chief writes the
        # model, results.json and the plot: on a loaded 2-core machine
        # (CI's two pytest processes, this job's two) 20 s ran out once.
        # A job whose process 1 dies never reaches that barrier: 20 s,
        # the survivor's wait for its heartbeat.
        process_timeout=20.0 if stop is not None and stop < 0 else 60.0,
        output_dir=output_dir,
    )
    if stop is not None and (stop > 0 or process_id == 1):

        def end():  # like a kill after epoch |stop|, its backup made
            if stop < 0:
                os._exit(1)  # process 1 dies; process 0 goes on alone
            print("RESULT " + json.dumps({"stopped": stop}), flush=True)
            os._exit(0)  # JAX's shutdown would wait for the peer

        interrupt_runs(pytest.MonkeyPatch(), abs(stop), end)
    results = imdb.train(config)
    return {
        "epochs": results["epochs"],
        "processes": results["processes"],
        "replicas": results["replicas"],
        "step_losses": results["step_losses"],
        "files": sorted(os.listdir(output_dir)),
        "chief": kmp.is_chief(),
    }


def alone(process_id, port):
    start = time.monotonic()
    try:
        kmp.initialize_processes(f"127.0.0.1:{port}", 2, process_id, timeout=3)
    except kmp.InputError as error:
        return {"error": str(error), "seconds": time.monotonic() - start}
    return {"error": None}


if __name__ == "__main__":
    mode, process_id, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if mode == "scaler":
        result = scaler(process_id, port)
    elif mode in ("train", "one"):
        stop = int(sys.argv[6]) if len(sys.argv) > 6 else None
        result = train(process_id, port, sys.argv[4], int(sys.argv[5]), stop)
    else:
        result = alone(process_id, port)
    print("RESULT " + json.dumps(result))
