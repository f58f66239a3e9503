"""One `kmp train` in a process of its own, counting traces and compiles.

    python tests/compiles.py TRAIN_ARGS...

TRAIN_ARGS follow `kmp train` (e.g. `cifar10 --data=synthetic ...
--compile_cache=DIR`). Prints `RESULT {...}`:

- `traces`: how often Keras's `train_step`, `test_step` and
  `predict_step` ran in Python. Inside a `tf.function` or `jax.jit` a
  step runs once per trace, so this is the step's tracing count on both
  backends (TensorFlow's `tf.function` and JAX's `jit` alike).
- `compiled` (JAX): the programs XLA compiled, per jitted function name,
  read from `jax_log_compiles`'s records, less `cache_hits`, those
  loaded from the persistent cache instead (JAX logs "Finished XLA
  compilation" for them too).
"""

import functools
import json
import logging
import os
import re
import sys
from collections import Counter

import keras

finished, hits, traces = Counter(), Counter(), Counter()


class _CompileLog(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        done = re.match(r"Finished XLA compilation of jit\((\w+)\)", message)
        if done:
            finished[done.group(1)] += 1
        hit = re.match(
            r"Persistent compilation cache hit for 'jit_(\w+)'", message
        )
        if hit:
            hits[hit.group(1)] += 1


if keras.backend.backend() == "jax":
    import jax

    logging.getLogger("jax").addHandler(_CompileLog())
    logging.getLogger("jax").setLevel(logging.DEBUG)
    jax.config.update("jax_log_compiles", True)


def _counted(name):
    step = getattr(keras.Model, name)

    @functools.wraps(step)  # JAX names the jitted program after it
    def counted(self, *args, **kwargs):
        traces[name] += 1
        return step(self, *args, **kwargs)

    return counted


for _name in ("train_step", "test_step", "predict_step"):
    setattr(keras.Model, _name, _counted(_name))

import kmp_cli  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
kmp_cli.main(["train", *sys.argv[1:]])
compiled = finished - hits
print(
    "RESULT "
    + json.dumps({"traces": traces, "compiled": compiled, "cache_hits": hits})
)
