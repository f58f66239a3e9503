"""Distributed training: `model.fit` under `tf.distribute`, and the cluster
it runs on.

    cluster   TF_CONFIG checked (`kmp.parse_tf_config`), the chief
              (`kmp.is_chief`), and a MultiWorkerMirroredStrategy that
              waits a bounded time for its workers
              (`kmp.multi_worker_strategy`)
    processes `kmp.initialize_processes`: a multi-process JAX job
              (keras.distribution's runtime), every process met at the
              coordinator within a bounded time
    fit       `kmp.distribute(model)`: Keras's fit/evaluate/predict made
              to work under the model's strategy, multi-worker included,
              with chief-only checkpoint writes and batch checks

Data flows from the cluster to the fit: a job reads TF_CONFIG, builds the
strategy, builds and compiles the model in its scope, then
`kmp.distribute`s it. This wing needs TensorFlow (imported where used).

Imports from kmp: backend, errors, scaling (kmp's scaler replaces the
one Keras put in place, which can hang a multi-worker job).

What keeps *replicas* in agreement inside one training step (every
replica skips an overflowing step, clipping acts on the summed
gradients) is not here: it is the loss scaler's job, in the core
(`kmp.scaling`, `kmp.backend.all_replicas_agree`), and works
under any strategy, `kmp.distribute` or not.
"""

from kmp.distributed.cluster import is_chief
from kmp.distributed.cluster import multi_worker_strategy
from kmp.distributed.cluster import parse_tf_config
from kmp.distributed.fit import distribute
from kmp.distributed.processes import initialize_processes

__all__ = [
    "distribute",
    "initialize_processes",
    "is_chief",
    "multi_worker_strategy",
    "parse_tf_config",
]
