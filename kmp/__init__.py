"""kmp: mixed-precision training for Keras 3 that a week-long run can trust.

The whole public API is imported here, name by name. The folders say
what the parts are (BUILD_NOTES.md, "Architecture", draws them):

    kmp/              the core: dtype policies, the loss scaler, float32
                      islands and their layers, the memory modes,
                      callbacks, the audit, and `backend`, the one place
                      where backends differ
    kmp/doctor/       the numerics doctor, `kmp.diagnose`
    kmp/distributed/  `fit` under tf.distribute, the cluster helpers, and
                      a multi-process JAX job's start
    kmp/app/          the `kmp` command, the example trainers' plumbing,
                      `kmp bench`, reports and datasets

Imports flow one way: the core imports no wing, a wing imports the core
and itself only, and the application uses this API (and nothing of kmp
imports the application).

`import kmp` loads all of it (and Keras), always, and registers kmp's
classes so that `keras.saving.load_model` finds them in a process that
only imported kmp. The `kmp` command answers `--help` and bad flags
before Keras loads because its entry point lives outside this package.
"""

from kmp import callbacks
from kmp import layers
from kmp._version import __version__
from kmp.auditing import AuditReport
from kmp.auditing import Finding
from kmp.auditing import audit
from kmp.compile_cache import enable_compile_cache
from kmp.distributed import distribute
from kmp.distributed import initialize_processes
from kmp.distributed import is_chief
from kmp.distributed import multi_worker_strategy
from kmp.distributed import parse_tf_config
from kmp.doctor import Diagnosis
from kmp.doctor import diagnose
from kmp.errors import InputError
from kmp.errors import InputTypeError
from kmp.fp8 import float8
from kmp.islands import pin_float32
from kmp.memory import rematerialize
from kmp.policy import Recommendation
from kmp.policy import disable
from kmp.policy import enable
from kmp.policy import policy_scope
from kmp.policy import recommend_policy
from kmp.saving import load_model
from kmp.scaling import LossScaleOptimizer
from kmp.scaling import wrap

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
    "initialize_processes",
    "is_chief",
    "layers",
    "load_model",
    "multi_worker_strategy",
    "parse_tf_config",
    "pin_float32",
    "policy_scope",
    "recommend_policy",
    "rematerialize",
    "wrap",
]
