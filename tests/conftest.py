"""Test harness: TF32 off; the global dtype policy, Keras distribution,
Keras's global state and the compile cache restored after each test; the
suite's two markers.

The suite runs once per backend (README: `KERAS_BACKEND=tensorflow`, then
`jax`, then `torch`):

- `slow`: a whole job (a multi-worker or multi-replica subprocess, an
  example trainer, a bench or doctor run of an example). The fast
  development command deselects them: `pytest -m "not slow"`.
- `backend_independent`: logic that no Keras backend changes (parsing,
  counting, formatting, argument checks). It runs under TensorFlow, or
  under the backend the marker names (`backend_independent("torch")`:
  the bench harness's runs of tiny models, which torch runs eagerly in a
  fifth of TensorFlow's time), and is deselected under the others, so
  each behaviour is tested once, or on every backend where it can differ.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# A JAX test spends most of its time in XLA's CPU compiler; LLVM's cheap
# pipeline compiles the same HLO programs about 16 % faster (measured on
# the slowest JAX tests). Subprocesses inherit it.
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_backend_optimization_level=0 "
    "--xla_llvm_disable_expensive_passes=true",
)
# The examples turn on kmp's compile cache by default: keep the suite's out
# of the user's ~/.cache (subprocesses inherit this too).
os.environ["XDG_CACHE_HOME"] = os.path.join(
    os.environ.get("TMPDIR", "/tmp"), f"kmp-test-cache-{os.getpid()}"
)

import keras  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

import kmp  # noqa: E402
from kmp import backend  # noqa: E402

# The suite runs as two processes (pyproject: `-n 2`). torch's eager ops
# start a thread per core in each, and two processes of 2 threads on 2
# cores fight (the torch suite took 326 s so, 220 s as one process): one
# thread each.
if os.environ.get("PYTEST_XDIST_WORKER") and backend.name() == "torch":
    import torch

    torch.set_num_threads(1)

# Correctness tests compare float32 results exactly; TF32 would round them.
backend.disable_tf32()

# Keras ops are slow to trace; hypothesis's default 200 ms deadline would
# flag compilation, not wrong answers.
settings.register_profile("kmp", deadline=None, max_examples=25)
settings.load_profile("kmp")

# Where backend-independent tests run.
INDEPENDENT_BACKEND = "tensorflow"


def pytest_xdist_auto_num_workers(config):
    """How many pytest processes `-n auto` (pyproject's addopts) starts:
    one a core, and one more under TensorFlow, whose suite waits on
    processes of its own (the 2-worker and MirroredStrategy jobs, a lost
    worker's bounded wait) and left about a third of 2 cores idle with
    one a core (2026-11-29, a 2-core VM: 616 CPU-s in 373 s as 2
    processes, 315 s as 3). JAX's and torch's keep their cores busy: the
    JAX suite as 3 processes took 574 s against 534 s as 2
    (2026-11-28)."""
    cores = len(os.sched_getaffinity(0))
    return cores + 1 if backend.name() == "tensorflow" else cores


def pytest_unconfigure(config):
    import shutil

    shutil.rmtree(os.environ["XDG_CACHE_HOME"], ignore_errors=True)


def pytest_report_header(config):
    return f"keras {keras.__version__}, backend: {backend.name()}"


def _runs_under(item):
    """The one backend a backend-independent test runs under, or None."""
    marker = item.get_closest_marker("backend_independent")
    if marker is None:
        return None
    return marker.args[0] if marker.args else INDEPENDENT_BACKEND


def pytest_collection_modifyitems(config, items):
    # Whole jobs first: the suite runs as two processes that steal each
    # other's pending tests (pyproject: `--dist worksteal`), and a
    # minutes-long job left for last would leave one process idle while
    # the other ran it (a sort that keeps each group's order: the same in
    # both processes, as xdist requires).
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    elsewhere = [
        item
        for item in items
        if _runs_under(item) not in (None, backend.name())
    ]
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = [item for item in items if item not in elsewhere]
        config._kmp_elsewhere = sorted({_runs_under(i) for i in elsewhere})


def pytest_terminal_summary(terminalreporter, config):
    elsewhere = getattr(config, "_kmp_elsewhere", [])
    if elsewhere:
        terminalreporter.write_line(
            "backend_independent tests were deselected: they run under "
            + " and ".join(f"KERAS_BACKEND={b}" for b in elsewhere)
            + "."
        )


@pytest.fixture(autouse=True)
def _restore_global_state():
    previous = keras.config.dtype_policy()
    yield
    # kmp's, not Keras's setter: kmp's record of its policy (and its
    # error notes) go too, so no later test warns that it was reset.
    kmp.enable(previous)
    keras.distribution.set_distribution(None)
    # Fresh layer names and global state; no gc.collect() (free_memory),
    # which took ~0.5 s per test, 40 % of the suite: Python's own
    # collector frees the models of earlier tests.
    keras.utils.clear_session(free_memory=False)
    backend.use_compile_cache(None)  # off, if a test turned it on


@pytest.fixture
def registry():
    """Keras's registry of serializable classes, and the module
    `util.saved_keras_io_transformer` forgets, as they were before the
    test."""
    import sys

    saved = dict(keras.saving.get_custom_objects())
    yield
    keras.saving.get_custom_objects().clear()
    keras.saving.get_custom_objects().update(saved)
    sys.modules.pop("keras_io_transformer", None)
