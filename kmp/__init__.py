"""kmp: mixed-precision training for Keras 3 that a week-long run can trust.

The whole public API is imported here, name by name. The folders say
what the parts are (BUILD_NOTES.md, "Architecture", draws them):

    kmp/              the core: dtype policies, the loss scaler, float32
                      islands and their layers, callbacks, the audit, and
                      `backend`, the one place where backends differ
    kmp/doctor/       the numerics doctor, `kmp.diagnose`
    kmp/distributed/  `fit` under tf.distribute, and the cluster helpers
    kmp/app/          the `kmp` command, the example trainers' plumbing,
                      `kmp bench`, reports and datasets

Imports flow one way: the core imports no wing, a wing imports the core
and itself only, and the application uses this API (and nothing of kmp
imports the application).

`import kmp` loads all of it (and Keras), and registers kmp's classes so
that `keras.saving.load_model` finds them. The one exception is the `kmp`
command: it parses its arguments first, so that `kmp --help` and a bad
flag answer at once, and loads the API when a command runs (the first
`kmp.<name>` does it).
"""

import os
import sys

from kmp._version import __version__


def _api() -> dict:
    """The public API, name by name."""
    from kmp import callbacks
    from kmp import layers
    from kmp._audit import AuditReport
    from kmp._audit import Finding
    from kmp._audit import audit
    from kmp._wrap import wrap
    from kmp.compile_cache import enable_compile_cache
    from kmp.distributed.cluster import is_chief
    from kmp.distributed.cluster import multi_worker_strategy
    from kmp.distributed.cluster import parse_tf_config
    from kmp.distributed.fit import distribute
    from kmp.doctor.diagnose import diagnose
    from kmp.doctor.diagnosis import Diagnosis
    from kmp.errors import InputError
    from kmp.errors import InputTypeError
    from kmp.float8_model import float8
    from kmp.islands import pin_float32
    from kmp.loss_scale_optimizer import LossScaleOptimizer
    from kmp.policy import Recommendation
    from kmp.policy import disable
    from kmp.policy import enable
    from kmp.policy import policy_scope
    from kmp.policy import recommend_policy

    return locals()


def __getattr__(name):
    # Reached only before the API is loaded (the `kmp` command), and by
    # `from kmp import callbacks` inside `_api()`, which must find nothing
    # so that the import system imports the submodule.
    if name in __all__ and not _loading:
        _load()
        return globals()[name]
    raise AttributeError(f"module 'kmp' has no attribute {name!r}")


_loading = False


def _load():
    global _loading
    _loading = True
    try:
        globals().update(_api())
    finally:
        _loading = False


def _started_by_the_kmp_command() -> bool:
    argv = getattr(sys, "argv", None) or [""]
    return os.path.basename(argv[0]) in ("kmp", "kmp.exe")


__all__ = [
    "AuditReport",
    "Diagnosis",
    "Finding",
    "InputError",
    "InputTypeError",
    "LossScaleOptimizer",
    "Recommendation",
    "__version__",
    "audit",
    "callbacks",
    "diagnose",
    "disable",
    "distribute",
    "enable",
    "enable_compile_cache",
    "float8",
    "is_chief",
    "layers",
    "multi_worker_strategy",
    "parse_tf_config",
    "pin_float32",
    "policy_scope",
    "recommend_policy",
    "wrap",
]

if not _started_by_the_kmp_command():
    _load()
