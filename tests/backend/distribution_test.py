"""The active distribution and the reductions over replicas
(`kmp.backend.distribution`) outside a multi-replica run; under
`tf.distribute`: tf_replicas_test.py and replicas_test.py."""

import subprocess
import sys
import textwrap

import keras
from keras import ops
from util import free_ports
from util import jax_only

from kmp import backend


def test_no_distribution_is_none_and_a_keras_one_is_named():
    assert backend.distribution_name() is None
    if backend.name() != "jax":
        return  # keras.distribution runs on JAX only
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    assert backend.distribution_name() == "DataParallel"


def test_one_replica_agrees_with_itself_and_sums_nothing():
    flag = ops.convert_to_tensor(False)
    assert not bool(backend.all_replicas_agree(flag))
    grads = [ops.convert_to_tensor([1.0, 3.0])]
    summed, replicas = backend.sum_over_replicas(grads)
    assert replicas == 1
    assert ops.convert_to_numpy(summed[0]).tolist() == [1.0, 3.0]


def test_outside_several_replicas_the_maximum_is_the_value_itself():
    values = [ops.convert_to_tensor([1.0, 5.0]), ops.convert_to_tensor(2.0)]
    out = backend.max_over_replicas(values)
    assert [ops.convert_to_numpy(v).tolist() for v in out] == [[1.0, 5.0], 2.0]


# A process of its own: JAX joins a job before it runs anything.
_SIGTERM_AFTER_THE_JOIN = """
import os, signal, sys
received = []
signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
from kmp import backend
backend.join_processes("localhost:{port}", 1, 0, timeout=30)
os.kill(os.getpid(), signal.SIGTERM)
for _ in range(100000):  # Python runs the handler between bytecodes
    pass
print("received", received)
"""


@jax_only
def test_a_sigterm_after_joining_processes_reaches_python():
    # JAX's preemption service would take it (its C++ handler in place
    # of Python's): the job trains on until the SIGKILL, and `kmp`
    # commands cannot stop in one line.
    (port,) = free_ports(1)
    code = textwrap.dedent(_SIGTERM_AFTER_THE_JOIN).format(port=port)
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "received [15]" in result.stdout, result.stderr[-2000:]
