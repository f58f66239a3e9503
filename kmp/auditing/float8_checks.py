"""The audit's float8 checks: float8 layers where they cannot be fast.

Float8 tensor cores exist from NVIDIA compute capability 8.9 (Ada, e.g.
L4, L40) and 9.0 (Hopper: H100, H200). Elsewhere `kmp.float8`'s layers
compute correctly, through float8 rounding, but the matmuls run in the
compute dtype plus the quantization's extra work: slower than bfloat16.
Keras's float8 layers (and kmp's own `Float8Dense`, ...) leave the FP8
GEMM to XLA's rewrite of quantize-dequantize-matmul, so a model compiled
without XLA has none, and neither has one on the torch backend; the
layers `kmp.float8` gives kmp's matmul (JAX, torch) call an FP8 GEMM
themselves, compiled or not.
"""

import keras

from kmp import backend
from kmp.fp8 import Float8Dense
from kmp.fp8 import Float8EinsumDense
from kmp.fp8 import float8_matmuls
from kmp.fp8 import matmul_sizes
from kmp.fp8.scaled_layers import SCALED_CLASSES
from kmp.scaling import LossScaleOptimizer

FLOAT8_CAPABILITY = (8, 9)


def has_float8_tensor_cores() -> bool:
    """Whether every GPU here multiplies float8 on tensor cores (and there
    is one)."""
    gpus = [d for d in backend.list_devices() if d.platform == "gpu"]
    return bool(gpus) and all(
        d.compute_capability is not None
        and d.compute_capability >= FLOAT8_CAPABILITY
        for d in gpus
    )


def check_float8(model, layers, findings):
    found = float8_matmuls(layers)
    if not found:
        return
    optimizer = getattr(model, "optimizer", None)
    keras_layers = [
        layer
        for layer in found
        if not isinstance(layer, (Float8Dense, Float8EinsumDense))
    ]
    if (
        keras_layers
        and isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        and not isinstance(optimizer, LossScaleOptimizer)
    ):
        findings.append(
            (
                "error",
                "optimizer",
                f"{len(keras_layers)} Keras float8 layers under Keras's "
                "LossScaleOptimizer: their output-gradient scales start at "
                "1 while the gradients carry the loss scale, so training "
                "depends on the loss scale, and under mixed_float16 a scale "
                "below float16's range makes every step NaN and skipped "
                "(BUILD_NOTES, defects 18 and 26).",
                "compile(optimizer=kmp.wrap(...)): kmp's scaler keeps them "
                "in units of the loss scale, floored within float16.",
            )
        )
    if not has_float8_tensor_cores():
        names = sorted({d.name for d in backend.list_devices()})
        findings.append(
            (
                "warning",
                "environment",
                f"{len(found)} float8 matmul layers on hardware without "
                f"float8 tensor cores ({', '.join(names)}; they need "
                "compute capability 8.9+: L4, L40, H100, H200). They "
                "compute correctly but slower than bfloat16.",
                "Leave kmp.float8 out on this machine; keep it for Ada or "
                "Hopper GPUs.",
            )
        )
    # The layers whose FP8 GEMM only XLA's rewrite makes.
    rewritten = [
        layer for layer in found if not isinstance(layer, SCALED_CLASSES)
    ]
    if rewritten and backend.step_compiler() != "XLA":
        findings.append(
            (
                "warning",
                "environment",
                f"{len(rewritten)} float8 matmul layers on the "
                f"{backend.name()} backend: only XLA turns their "
                "dequantize-then-matmul into FP8 GEMMs, so here they "
                "compute correctly but in the compute dtype, slower than "
                "without float8.",
                "kmp.float8(model, matmul='kmp') gives them kmp's float8 "
                "matmul (torch._scaled_mm here); or use KERAS_BACKEND=jax "
                "or tensorflow.",
            )
        )
    elif (
        backend.name() == "tensorflow"
        and getattr(model, "compiled", False)
        and model.run_eagerly
        and any(
            not isinstance(layer, (Float8Dense, Float8EinsumDense))
            for layer in found
        )
    ):
        findings.append(
            (
                "error",
                "environment",
                f"{len(found)} Keras float8 layers in a model compiled with "
                "run_eagerly=True on TensorFlow: their custom gradient "
                "fails in eager TensorFlow (ValueError: too many values to "
                "unpack), so fit cannot take a step.",
                "model.compile(..., run_eagerly=False).",
            )
        )
    elif (
        rewritten
        and getattr(model, "compiled", False)
        and not getattr(model, "jit_compile", True)
    ):
        findings.append(
            (
                "warning",
                "environment",
                "Float8 layers in a model compiled without XLA "
                "(jit_compile=False): XLA makes their FP8 GEMMs.",
                "model.compile(..., jit_compile=True).",
            )
        )
    for layer in found:
        contracting, output = matmul_sizes(layer)
        if contracting % 16 or output % 16:
            findings.append(
                (
                    "warning",
                    layer.path or layer.name,
                    f"Float8 matmul of size {contracting} -> {output}: "
                    "float8 tensor cores take multiples of 16, so XLA pads "
                    "it on every step.",
                    "Use sizes that are multiples of 16, or a plain layer "
                    "here (kmp.float8 skips such layers).",
                )
            )
