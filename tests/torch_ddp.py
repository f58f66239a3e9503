"""One process of a 2-process PyTorch DistributedDataParallel job.

    python tests/torch_ddp.py RANK PORT

The recipe kmp gives torch users for several GPUs (Keras's torch backend
has no multi-device `fit`): a Keras model inside
`torch.nn.parallel.DistributedDataParallel`, a custom loop, and kmp's
scaler. Here on CPUs with the gloo backend, each rank on its own data;
at step 2 rank 1's batch holds an inf. DDP averages the gradients in
`backward`, so both ranks see the same non-finite gradients and skip the
same step. Prints `RESULT {...}` (rank, skipped steps, scale, weights).
A helper for tests/replicas_test.py.
"""

import datetime
import json
import os
import sys

os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from keras import ops  # noqa: E402
from util import classification_data  # noqa: E402

import kmp  # noqa: E402


def main(rank, port):
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        # A rank that dies ends the other's collectives with an error.
        timeout=datetime.timedelta(seconds=90),
    )
    kmp.enable("mixed_float16")
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(2),
            keras.layers.Activation("softmax", dtype="float32"),
        ]
    )
    # DDP broadcasts rank 0's weights to every rank here. (No seeding:
    # Keras's set_random_seed would import TensorFlow where installed.)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = kmp.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=2.0**10
    )
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    x, y = classification_data(n=64, seed=rank)
    for step in range(5):
        batch = x.copy()
        if rank == 1 and step == 2:
            batch[0, 0] = float("inf")
        ddp.zero_grad()
        loss = loss_fn(y, ddp(ops.convert_to_tensor(batch), training=True))
        optimizer.scale_loss(loss).backward()  # DDP averages the grads
        grads = [v.value.grad for v in model.trainable_variables]
        with torch.no_grad():
            optimizer.apply(grads, model.trainable_variables)
    result = {
        "rank": rank,
        "skipped": int(optimizer.skipped_steps),
        "iterations": int(optimizer.iterations),
        "scale": float(optimizer.loss_scale),
        "weights": [v.numpy().tolist() for v in model.trainable_variables],
    }
    # DDP's reducer is freed before its process group is destroyed: freed
    # after (when main returns), it hung one run in three at exit.
    del ddp
    dist.destroy_process_group()
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
