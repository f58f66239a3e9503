"""The audit's checks of the machine and the run: hardware where mixed
precision is not faster, or cannot compile a float16 attention, TF32,
XLA, and an active distribution (its mesh, and variables it does not
hold as laid out).

Each `check_*` appends `(severity, where, problem, fix)` tuples to
`findings`, as in `model_checks`, with `where` = `"environment"`.
"""

import functools
import inspect

import keras

from kmp import backend
from kmp import policy as policy_lib
from kmp.model_layers import all_layers

ENVIRONMENT = "environment"


def check_environment(model, half, findings):
    recommendation = policy_lib.recommend_policy()
    if half and recommendation.policy == "float32":
        findings.append(
            (
                "warning",
                ENVIRONMENT,
                "Mixed precision on hardware without half-precision "
                f"matmul units. {recommendation.reason} Measured on a "
                "2-core CPU (benchmarks/policy_speed.py): 0.8-1.1x "
                "float32's speed with XLA, 0.13x (bfloat16) and 0.26x "
                "(float16) without.",
                "kmp.enable('auto') picks float32 here.",
            )
        )
    check_cpu_attention(half, findings)
    tf32 = backend.tf32_enabled()
    ampere = any(
        d.platform == "gpu"
        and d.compute_capability is not None
        and d.compute_capability >= (8, 0)
        for d in backend.list_devices()
    )
    if tf32 is not None and ampere:  # only Ampere+ GPUs have TF32
        findings.append(
            (
                "info",
                ENVIRONMENT,
                f"TF32 for float32 matmuls is {'on' if tf32 else 'off'}.",
                "A float32 baseline on an Ampere+ GPU is TF32 when on.",
            )
        )
    jit = getattr(model, "jit_compile", None)
    compiled = getattr(model, "compiled", False) and half  # mixed only
    compiler = backend.step_compiler()
    if compiled and jit:
        findings.append(
            ("info", ENVIRONMENT, f"{compiler} is on (jit_compile=True).", "-")
        )
    elif compiled and not all(
        getattr(layer, "supports_jit", True) for layer in all_layers(model)
    ):
        # Keras compiles no step of a model with such a layer (a
        # TextVectorization: keras-io's end-to-end text classifier) and
        # says so at compile: no fix to give.
        unjitted = next(
            type(layer).__name__
            for layer in all_layers(model)
            if not getattr(layer, "supports_jit", True)
        )
        findings.append(
            (
                "info",
                ENVIRONMENT,
                f"The step is not compiled: Keras compiles no model holding "
                f"a {unjitted} (its supports_jit is False), so the casts "
                "to the compute dtype are ops of their own.",
                "Run that layer in the input pipeline (tf.data), as "
                "keras-io's text examples do for training, to compile the "
                "model.",
            )
        )
    elif compiled and compiler == "XLA":
        findings.append(
            (
                "warning",
                ENVIRONMENT,
                "The model is compiled without XLA (jit_compile=False); "
                "unfused casts make mixed precision slower.",
                "model.compile(..., jit_compile=True).",
            )
        )
    elif compiled:
        # Keras's default on torch; whether torch.compile pays for its
        # compile time on a GPU is unmeasured here, so no warning.
        findings.append(
            (
                "info",
                ENVIRONMENT,
                "The model runs eagerly (jit_compile=False, Keras's "
                "default on torch): each layer's casts to the compute "
                "dtype are kernels of their own.",
                "model.compile(..., jit_compile=True) compiles the step "
                "with torch.compile (minutes to compile on a CPU).",
            )
        )
    strategy = backend.distribution_name()
    if strategy is not None:
        problem = f"A distribution is active: {strategy}."
        fix = "Check that every replica uses kmp.wrap(...)'s optimizer."
        described = backend.mesh() if backend.name() == "jax" else None
        if described is not None:
            shape, axes, batch_devices = described
            problem = (
                f"A distribution is active: {strategy} on a mesh of shape "
                f"{shape}, axes {axes}; each global batch is split over "
                f"{batch_devices} device(s)."
            )
            fix = (
                f"Give a global batch that is a multiple of {batch_devices}; "
                "kmp's scaler works under it as is."
            )
        findings.append(("info", ENVIRONMENT, problem, fix))
    check_layout(model, findings)


def check_cpu_attention(half, findings):
    """A float16 attention that JAX's CPU cannot compile: its
    `dot_general` has no float16 matmul that accumulates in float32, which
    Keras's fused attention asks for (`backend.float16_attention_fails`).
    Said here, where the model is known, rather than by `kmp.enable`."""
    if not backend.float16_attention_fails(backend.list_devices()):
        return
    seen = set()
    for layer in half:
        cls = type(layer)
        if layer.compute_dtype != "float16" or cls in seen:
            continue
        if not _fused_attention(layer):
            continue
        seen.add(cls)
        findings.append(
            (
                "error",
                layer.path or layer.name,
                f"{cls.__name__} computes its attention with Keras's fused "
                "ops.dot_product_attention in float16, which JAX's CPU "
                "fails to compile (\"The precision 'F16_F16_F32' is not "
                'supported by dot_general on CPU"; a GPU compiles it).',
                "On this CPU: kmp.enable('mixed_bfloat16'), or "
                "kmp.enable('auto') (float32).",
            )
        )


def _fused_attention(layer) -> bool:
    """Whether `layer` runs `ops.dot_product_attention`: Keras's
    attentions where they run it (no dropout; `MultiHeadAttention` over
    one axis, its projected query 4-D), KerasHub's where their own
    `_use_fused_attention_op()` says so (Gemma's does not on a CPU), any
    other class whose code calls it (KerasHub's Llama does on JAX)."""
    if getattr(layer, "dropout", 0.0):
        return False
    if isinstance(layer, keras.layers.MultiHeadAttention):
        axes = layer.attention_axes  # None: not built
        return axes is not None and len(axes) == 1
    if isinstance(layer, keras.layers.GroupQueryAttention):
        return True
    decides = getattr(layer, "_use_fused_attention_op", None)
    if callable(decides):
        try:
            return bool(decides())
        except TypeError:  # one that takes arguments: read its code
            pass
    return any(_calls_fused_attention(cls) for cls in type(layer).__mro__)


@functools.cache
def _calls_fused_attention(cls) -> bool:
    if cls.__module__.startswith("keras.src."):  # Keras's bases: above
        return False
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return False
    return "dot_product_attention(" in source


def check_layout(model, findings):
    """Variables the keras.distribution does not hold as its layout says;
    Keras is silent about both kinds (`backend.layout_problems`)."""
    problems = backend.layout_problems(model.weights)
    uneven = [(path, what) for path, what in problems if "split" in what]
    placed = [path for path, what in problems if "split" not in what]
    for path, what in uneven:
        findings.append(
            (
                "warning",
                path,
                f"The distribution's layout splits this variable, but its "
                f"{what}: JAX refuses to build or load the model under "
                "this distribution (IndivisibleError, naming no "
                "variable).",
                "Make that dimension a multiple of the axis size, or leave "
                "the variable out of the layout map.",
            )
        )
    if placed:
        findings.append(
            (
                "warning",
                ENVIRONMENT,
                f"{len(placed)} variable(s) are not on every device of the "
                f"distribution's mesh (e.g. {placed[0]}): the model was "
                "built before keras.distribution.set_distribution, so the "
                "layout is not applied.",
                "Set the distribution first, then build the model (Keras "
                "places each variable when it makes it).",
            )
        )
