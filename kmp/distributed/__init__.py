"""Distributed training: `model.fit` under `tf.distribute`, and the cluster
it runs on.

    cluster   TF_CONFIG checked (`kmp.parse_tf_config`), the chief
              (`kmp.is_chief`), and a MultiWorkerMirroredStrategy that
              waits a bounded time for its workers
              (`kmp.multi_worker_strategy`)
    fit       `kmp.distribute(model)`: Keras's fit/evaluate/predict made
              to work under the model's strategy, multi-worker included,
              with chief-only checkpoint writes and batch checks

Data flows from the cluster to the fit: a job reads TF_CONFIG, builds the
strategy, builds and compiles the model in its scope, then
`kmp.distribute`s it. This wing needs TensorFlow (imported where used)
and imports nothing of kmp but the core's `backend`.

What keeps *replicas* in agreement inside one training step (every
replica skips an overflowing step, clipping acts on the summed
gradients) is not here: it is the loss scaler's job, in the core
(`kmp.LossScaleOptimizer`, `kmp.backend.all_replicas_agree`), and works
under any strategy, `kmp.distribute` or not.
"""
