"""One small `fit` in a process of its own, counting XLA compilations.

    python tests/compiles.py [CACHE_DIR]

With CACHE_DIR, `kmp.enable_compile_cache(CACHE_DIR)` first. Prints
`RESULT {...}`: the number of programs XLA compiled (`compiled`) and
those loaded from the persistent cache instead (`cache_hits`), per jitted
function name. JAX
only: it reads `jax_log_compiles`'s log records.
"""

import json
import logging
import re
import sys
from collections import Counter

import jax

finished, hits = Counter(), Counter()
HIT = re.compile(r"Persistent compilation cache hit for 'jit_(\w+)'")


class _Counter(logging.Handler):
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


logging.getLogger("jax").addHandler(_Counter())
logging.getLogger("jax").setLevel(logging.DEBUG)
jax.config.update("jax_log_compiles", True)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kmp  # noqa: E402

if len(sys.argv) > 1:
    kmp.enable_compile_cache(sys.argv[1])
kmp.enable("mixed_float16")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
model.compile(kmp.wrap("adam"), "mse")
x, y = np.ones((64, 8), "float32"), np.ones((64, 4), "float32")
model.fit(x, y, batch_size=32, epochs=2, verbose=0, validation_data=(x, y))
# JAX logs "Finished XLA compilation" for a program loaded from the cache
# too; those are the hits.
compiled = finished - hits
print("RESULT " + json.dumps({"compiled": compiled, "cache_hits": hits}))
