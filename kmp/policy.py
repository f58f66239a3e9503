"""Dtype policies: `kmp.enable`, `kmp.disable`, `kmp.policy_scope` and the
hardware-aware `kmp.recommend_policy`.

`enable` is a thin, reversible layer over `keras.config.set_dtype_policy`.
What Keras lacks is the hardware decision, which is made in one function,
`choose_policy`, from the devices `kmp.backend.list_devices` reports, and
which returns the choice *and* the reason for it.
"""

import contextlib
import logging
import warnings
from typing import NamedTuple

import keras

from kmp import backend
from kmp.errors import InputError
from kmp_config.names import HALF_DTYPES
from kmp_config.names import MASTER_WEIGHTS
from kmp_config.names import POLICIES

logger = logging.getLogger("kmp")


# Tensor cores for float16 arrived with Volta (7.0); bfloat16 tensor cores
# with Ampere (8.0), where bfloat16's float32-sized exponent makes loss
# scaling unnecessary.
_FP16_TENSOR_CORES = (7, 0)
_BF16_TENSOR_CORES = (8, 0)

# Each reason is logged once per process, not at every call.
_logged_reasons = set()

# The policy object `enable` last put in force, while it computes in 16
# bits (else None), for `warn_if_reset`.
_enabled = None


class Recommendation(NamedTuple):
    """The policy kmp recommends for this machine, and why.

    Attributes:
        policy: `"mixed_bfloat16"`, `"mixed_float16"` or `"float32"`.
        reason: One human-readable sentence.
    """

    policy: str
    reason: str


def choose_policy(devices: list[backend.Device]) -> Recommendation:
    """Picks a dtype policy for a list of devices.

    This is kmp's whole hardware rule; `recommend_policy` feeds it the
    devices the Keras backend sees.

    - TPU: `mixed_bfloat16` (bfloat16 is the TPU's native matmul type).
    - NVIDIA GPU, compute capability >= 8.0: `mixed_bfloat16` (tensor cores,
      no loss scaling needed).
    - NVIDIA GPU, 7.x: `mixed_float16` (tensor cores for float16 only; use
      a loss-scaling optimizer, see `kmp.wrap`).
    - Older or unidentified GPU, or CPU only: `float32`, since half
      precision is not accelerated there (on a 2-core CPU a convnet
      trained at about float32's speed with XLA and 4-10x slower without:
      `benchmarks/policy_speed.py`, BENCHMARKS.md).

    With several GPUs, the least capable one decides.

    Args:
        devices: `kmp.backend.Device` tuples.

    Returns:
        A `Recommendation(policy, reason)`.
    """
    if any(d.platform == "tpu" for d in devices):
        return Recommendation(
            "mixed_bfloat16", "TPU found: bfloat16 is its native matmul type."
        )
    gpus = [d for d in devices if d.platform == "gpu"]
    if not gpus:
        return Recommendation(
            "float32",
            "No GPU or TPU found: a CPU has no float16/bfloat16 matmul "
            "units, so mixed precision runs at about float32's speed with "
            "XLA and several times slower without it (see BENCHMARKS.md).",
        )
    unknown = [d for d in gpus if d.compute_capability is None]
    if unknown:
        return Recommendation(
            "float32",
            f"GPU {unknown[0].name!r} reports no NVIDIA compute capability, "
            "so kmp cannot tell whether it has tensor cores; pass a policy "
            "explicitly if you know it does.",
        )
    weakest = min(gpus, key=lambda d: d.compute_capability)
    capability = weakest.compute_capability
    shown = f"{weakest.name} (compute capability {capability[0]}."
    shown += f"{capability[1]})"
    if capability >= _BF16_TENSOR_CORES:
        return Recommendation(
            "mixed_bfloat16",
            f"{shown} has bfloat16 tensor cores; bfloat16 has float32's "
            "range, so no loss scaling is needed.",
        )
    if capability >= _FP16_TENSOR_CORES:
        return Recommendation(
            "mixed_float16",
            f"{shown} has float16 tensor cores but none for bfloat16; "
            "compile with kmp.wrap(optimizer) to scale the loss.",
        )
    return Recommendation(
        "float32",
        f"{shown} has no tensor cores (they need 7.0), so half precision "
        "would not be faster than float32.",
    )


def recommend_policy() -> Recommendation:
    """Recommends a dtype policy for the devices Keras will use.

    Works with the TensorFlow and the JAX backend. The rule is
    `kmp.policy.choose_policy`.

    Returns:
        A `Recommendation(policy, reason)`.

    Example:

    ```python
    policy, reason = kmp.recommend_policy()
    print(f"{policy}: {reason}")
    ```
    """
    return choose_policy(backend.list_devices())


def _log_once(level, message):
    if message not in _logged_reasons:
        _logged_reasons.add(message)
        logger.log(level, message)


def _resolve(policy) -> str:
    if isinstance(policy, keras.DTypePolicy):
        policy = policy.name
    if not isinstance(policy, str) or policy not in POLICIES:
        raise InputError(
            f"Unsupported dtype policy {policy!r}. Expected one of "
            f"{', '.join(repr(p) for p in POLICIES)}, or a keras.DTypePolicy "
            "with one of those names (other Keras policies, e.g. quantized "
            "ones, can be set with keras.config.set_dtype_policy)."
        )
    if policy == "float32":
        return policy
    if policy != "auto":
        devices = backend.list_devices()
        recommended = choose_policy(devices)
        if recommended.policy == "float32":
            # (What a float16 attention meets on JAX's CPU, `kmp.audit`
            # says of a model that has one: this line is every model's.)
            _log_once(
                logging.WARNING,
                f"kmp: {policy} will likely be slower than float32 here. "
                f"{recommended.reason}",
            )
        elif policy != recommended.policy == "mixed_float16":
            _log_once(
                logging.WARNING,
                f"kmp: {policy} has no tensor cores here; mixed_float16 "
                f"would be faster. {recommended.reason}",
            )
        return policy
    recommended = recommend_policy()
    _log_once(
        logging.WARNING if recommended.policy == "float32" else logging.INFO,
        f"kmp: policy 'auto' -> {recommended.policy}. {recommended.reason}",
    )
    return recommended.policy


def enable(
    policy="mixed_float16", master_weights="float32"
) -> keras.DTypePolicy:
    """Sets Keras's global dtype policy for mixed-precision training.

    Layers created afterwards compute in the policy's `compute_dtype` and
    keep their variables in its `variable_dtype` (float32). Under
    `"mixed_float16"`, compile with `kmp.wrap(optimizer)` so the loss is
    scaled. On hardware where mixed precision is slower (CPU, pre-Volta
    GPUs), a warning says so, once. While a 16-bit policy is in force, a
    mixed-dtype error of a layer or step of yours ends with a line of
    kmp's (`kmp.backend.dtype_errors`), and a `keras.layers.Normalization`
    made or adapted then computes in float32
    (`kmp.islands.feature_normalization`: in float16 a raw feature with
    a variance over 65504 comes out 0).

    `master_weights="bfloat16"` (with `"mixed_bfloat16"`) stores the
    variables in bfloat16 too: Keras's `"bfloat16"` policy, 2 bytes per
    weight instead of 4. Compile with `kmp.wrap(optimizer)`, which then
    rounds each update stochastically: rounded to nearest, an update
    under half a bfloat16 step (2**-9 of the weight) is lost and
    training stalls. Float32 islands (`kmp.pin_float32`) still compute
    in float32.

    Args:
        policy: `"mixed_float16"`, `"mixed_bfloat16"`, `"float32"`, `"auto"`
            (the result of `kmp.recommend_policy()`, whose reason is logged
            once), or a `keras.DTypePolicy` with one of those names (or
            `"bfloat16"`, as `enable` returns it in the bfloat16-masters
            mode).
        master_weights: `"float32"` (Keras's mixed policies) or
            `"bfloat16"` (only with a policy that computes in bfloat16).

    Returns:
        The previous global `keras.DTypePolicy`; pass it back to `enable`
        to restore it.

    Example:

    ```python
    previous = kmp.enable("mixed_float16")
    model = build_model()                # float16 compute, float32 weights
    model.compile(optimizer=kmp.wrap("adam"), loss="mse")
    kmp.enable(previous)
    ```
    """
    if isinstance(policy, keras.DTypePolicy) and policy.name == "bfloat16":
        policy, master_weights = "mixed_bfloat16", "bfloat16"
    if master_weights not in MASTER_WEIGHTS:
        raise InputError(
            f"master_weights={master_weights!r} is not supported; use one "
            f"of {MASTER_WEIGHTS}."
        )
    name = _resolve(policy)
    if master_weights == "bfloat16":
        if name != "mixed_bfloat16":
            raise InputError(
                f"master_weights='bfloat16' needs a policy that computes in "
                f"bfloat16; the policy is {name!r} (from {policy!r}). Use "
                "kmp.enable('mixed_bfloat16', master_weights='bfloat16')."
            )
        name = "bfloat16"  # Keras's: bfloat16 compute and variables
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    _in_force()
    return previous


def disable() -> keras.DTypePolicy:
    """Restores the float32 global policy; returns the previous policy."""
    return enable("float32")


@contextlib.contextmanager
def policy_scope(policy="mixed_float16", master_weights="float32"):
    """Context manager: `kmp.enable(policy)` inside, the old policy after.

    The previous global policy is restored on exit, also when the block
    raises.

    Args:
        policy: As for `kmp.enable`.
        master_weights: As for `kmp.enable`.

    Yields:
        The global `keras.DTypePolicy` now in force.

    Example:

    ```python
    with kmp.policy_scope("mixed_bfloat16"):
        model = build_model()
    ```
    """
    previous = enable(policy, master_weights)
    try:
        yield keras.config.dtype_policy()
    finally:
        keras.config.set_dtype_policy(previous)
        _in_force()


def _in_force():
    """After kmp sets the global policy: its error notes on or off, and
    the policy remembered for `warn_if_reset`."""
    global _enabled
    backend.note_dtype_errors()
    policy = keras.config.dtype_policy()
    _enabled = policy if policy.compute_dtype in HALF_DTYPES else None


def warn_if_reset(caller: str) -> bool:
    """Warns when the 16-bit policy `kmp.enable` set is gone and Keras's
    global policy computes in float32; returns whether it warned.

    `keras.utils.clear_session()` (`keras.backend.clear_session()`, which
    keras-io's examples call before building a model to free memory)
    resets the global policy to float32, and so does
    `keras.config.set_dtype_policy`. After either, the model builds in
    float32, `kmp.wrap` returns the optimizer with no loss scale, and
    nothing would say so: `kmp.wrap` and `kmp.pin_float32` call this.

    Args:
        caller: The kmp function the warning names, e.g. `"wrap"`.
    """
    policy = keras.config.dtype_policy()
    if (
        _enabled is None
        or policy is _enabled
        or policy.compute_dtype in HALF_DTYPES
    ):
        return False
    warnings.warn(
        f"kmp.{caller}: kmp.enable({_enabled.name!r}) set Keras's global "
        f"dtype policy, but it is {policy.name!r} now, so the model "
        f"trains in {policy.compute_dtype}: keras.utils.clear_session() (or "
        "keras.backend.clear_session()) resets it, as "
        "keras.config.set_dtype_policy does. Call kmp.enable after "
        "clear_session, before building the model; to train in float32 "
        "on purpose, call kmp.disable().",
        stacklevel=3,
    )
    return True
