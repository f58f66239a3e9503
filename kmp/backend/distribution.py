"""Replicas under a distribution: which one is active, and the
reductions that keep every replica's scaler in agreement.

Under `tf.distribute` each replica holds its own local gradients, so its
own finiteness verdict; these reduce them (`_tf_replicas`). On JAX the
gradients are global arrays and Keras's torch backend runs one replica,
so there is nothing to reduce.
"""

import keras

from kmp.backend._current import name


def distribution_name() -> str | None:
    """The active `tf.distribute` strategy or Keras distribution, if any."""
    if name() == "tensorflow":
        import tensorflow as tf

        if tf.distribute.has_strategy():
            return type(tf.distribute.get_strategy()).__name__
    distribution = keras.distribution.distribution()
    return None if distribution is None else type(distribution).__name__


def mesh() -> tuple | None:
    """`(shape, axis_names, batch_devices)` of the keras.distribution in
    force (JAX), `batch_devices` being the size of its batch axis; `None`
    without one."""
    distribution = keras.distribution.distribution()
    if distribution is None:
        return None
    device_mesh = distribution.device_mesh
    names = list(device_mesh.axis_names)
    batch = distribution.batch_dim_name
    batch_devices = device_mesh.shape[names.index(batch)] if batch else 1
    return tuple(device_mesh.shape), names, batch_devices


def all_replicas_agree(flag):
    """The AND of a boolean scalar over every replica on every worker.

    Under `tf.distribute`, each replica holds its own local gradients, so a
    local finiteness check can differ between replicas; this all-reduces
    it (`kmp.backend._tf_replicas`). On JAX the gradients are global arrays, and
    Keras's torch backend runs one replica, so `flag` already covers
    every device.
    """
    if name() != "tensorflow":
        return flag
    from kmp.backend import _tf_replicas

    return _tf_replicas.all_agree(flag)


def sum_over_replicas(grads):
    """All-reduces (sums) gradients over `tf.distribute` replicas.

    Returns:
        `(grads, replicas)`: the summed gradients and the number of
        replicas in sync; the gradients unchanged and 1 outside a
        multi-replica `tf.distribute` replica context (and on JAX and
        torch, see `all_replicas_agree`).
    """
    if name() != "tensorflow":
        return list(grads), 1
    from kmp.backend import _tf_replicas

    return _tf_replicas.sum_over_replicas(grads)


def max_over_replicas(values):
    """The elementwise maximum of each tensor over `tf.distribute`
    replicas (the statistic of the global batch, where each replica saw
    its own part); unchanged outside a multi-replica replica context, and
    on JAX and torch (see `all_replicas_agree`)."""
    if name() != "tensorflow":
        return list(values)
    from kmp.backend import _tf_replicas

    return _tf_replicas.max_over_replicas(values)
