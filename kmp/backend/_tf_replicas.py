"""Replicas under `tf.distribute`: the TensorFlow bodies of
`kmp.backend.all_replicas_agree` and `kmp.backend.sum_over_replicas`,
which `kmp.LossScaleOptimizer` uses so that every replica skips a step
any replica overflows on (BUILD_NOTES.md, defect 11) and clipping acts on
the summed gradients (defect 12). This module branches on nothing; it is
imported on the TensorFlow backend only.
"""


def replica_context():
    """The `tf.distribute` replica context when several replicas are in
    sync, else None."""
    import tensorflow as tf

    if not tf.distribute.has_strategy() or (
        tf.distribute.in_cross_replica_context()
    ):
        return None
    context = tf.distribute.get_replica_context()
    return context if context.num_replicas_in_sync > 1 else None


def all_agree(flag):
    """The AND of a boolean scalar over the replicas in sync."""
    import tensorflow as tf

    context = replica_context()
    if context is None:
        return flag
    # ReduceOp has no MIN: count the replicas that disagree.
    dissent = context.all_reduce(
        tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(flag), tf.float32)
    )
    return tf.equal(dissent, 0.0)


def sum_over_replicas(grads):
    """`(summed grads, replicas in sync)`; `(grads, 1)` outside a
    multi-replica replica context."""
    import tensorflow as tf

    grads = list(grads)
    context = replica_context()
    if context is None:
        return grads, 1
    present = [g for g in grads if g is not None]
    summed = iter(context.all_reduce(tf.distribute.ReduceOp.SUM, present))
    return [
        None if g is None else next(summed) for g in grads
    ], context.num_replicas_in_sync


def max_over_replicas(values):
    """The elementwise MAX of each tensor over the replicas in sync;
    `values` unchanged outside a multi-replica replica context."""
    import tensorflow as tf

    values = list(values)
    context = replica_context()
    if context is None or not values:
        return values
    # ReduceOp has no MAX: gather every replica's copy, then reduce.
    gathered = context.all_gather([v[None] for v in values], axis=0)
    return [tf.reduce_max(g, axis=0) for g in gathered]
