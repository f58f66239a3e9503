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
"""

from kmp import callbacks
from kmp import layers
from kmp._version import __version__
from kmp._wrap import wrap
from kmp.audit import AuditReport
from kmp.audit import Finding
from kmp.audit import audit
from kmp.distributed.cluster import is_chief
from kmp.distributed.cluster import multi_worker_strategy
from kmp.distributed.cluster import parse_tf_config
from kmp.distributed.fit import distribute
from kmp.doctor.diagnose import diagnose
from kmp.doctor.diagnosis import Diagnosis
from kmp.islands import pin_float32
from kmp.loss_scale_optimizer import LossScaleOptimizer
from kmp.policy import Recommendation
from kmp.policy import disable
from kmp.policy import enable
from kmp.policy import policy_scope
from kmp.policy import recommend_policy

__all__ = [
    "AuditReport",
    "Diagnosis",
    "Finding",
    "LossScaleOptimizer",
    "Recommendation",
    "__version__",
    "audit",
    "callbacks",
    "diagnose",
    "disable",
    "distribute",
    "enable",
    "is_chief",
    "layers",
    "multi_worker_strategy",
    "parse_tf_config",
    "pin_float32",
    "policy_scope",
    "recommend_policy",
    "wrap",
]
