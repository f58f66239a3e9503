"""kmp: mixed-precision training for Keras 3 that a week-long run can trust.

The whole public API is imported here, name by name.
"""

from kmp import callbacks
from kmp import layers
from kmp.audit import AuditReport
from kmp.audit import Finding
from kmp.audit import audit
from kmp.cluster import is_chief
from kmp.cluster import multi_worker_strategy
from kmp.cluster import parse_tf_config
from kmp.diagnosis import Diagnosis
from kmp.distributed import distribute
from kmp.doctor import diagnose
from kmp.islands import pin_float32
from kmp.loss_scale_optimizer import LossScaleOptimizer
from kmp.loss_scale_optimizer import wrap
from kmp.policy import Recommendation
from kmp.policy import disable
from kmp.policy import enable
from kmp.policy import policy_scope
from kmp.policy import recommend_policy

__version__ = "0.1.0"

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
