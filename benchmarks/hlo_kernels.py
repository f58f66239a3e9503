"""The kernels of a compiled XLA GPU program, counted from its HLO text
(`benchmarks/gpu_compile.py`).

`kernels(hlo)` lists each kernel of the entry computation (a fusion, a
copy, a library call), with the bytes its operands and result hold and,
for a cuBLAS GEMM, its FLOPs; `summary(hlo, bandwidth)` adds them up.
The bytes are what a kernel must move at least (each operand read once,
its result written once), so bytes over the memory's bandwidth bound
the kernel's time from below.
"""

import collections
import math
import re

# The GEMMs' library calls in a compiled program.
FP8_GEMM = "__cublas$lt$matmul$f8"
GEMM = "__cublas$lt$matmul"
# An HLO array type: `bf16[8192,2048]`.
ARRAY = re.compile(r"\b(pred|[a-z]+\d+[a-z0-9]*)\[([\d,]*)\]")
# A kernel that moves less than this is "small" (a scalar's arithmetic,
# an amax's second pass).
SMALL = 64 * 1024
BYTES = {"pred": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s8": 1, "u8": 1}


def array_bytes(text):
    """Bytes of every array type in `text` (a tuple's are summed)."""
    total = 0
    for dtype, dims in ARRAY.findall(text):
        if dtype.startswith("f8"):
            width = 1
        else:
            width = BYTES.get(dtype) or int(re.sub(r"\D", "", dtype)) // 8
        total += width * _product(dims.split(","))
    return total


def _product(dims):
    """The product of HLO dimension strings (`""`, a scalar's, is 1)."""
    return math.prod(int(dim) for dim in dims if dim)


def kernels(hlo):
    """The kernels of a compiled module's entry computation: for each, its
    kind (a custom call's target, `fusion`, `copy`, ...), the bytes of
    its operands and result, and a GEMM's FLOPs and whether it adds its
    product to a tensor it reads (`beta` not 0)."""
    entry = hlo[hlo.index("\nENTRY") :]
    types, found = {}, []
    # `%name = TYPE op(%a, %b), attributes`
    line_form = re.compile(r"\s*(?:ROOT )?%(\S+) = (.+?) ([a-z][\w-]*)\((.*)$")
    for line in entry.splitlines()[1:]:
        match = line_form.match(line)
        if not match:
            continue
        name, type_, op, rest = match.groups()
        types[name] = type_
        if op in (
            "parameter",
            "constant",
            "get-tuple-element",
            "bitcast",
            "tuple",
        ):
            continue  # no kernel
        operands = re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])
        target = re.search(r'custom_call_target="([^"]+)"', line)
        kind = target.group(1) if target else op
        result, flops, adds = type_, 0, False
        if kind in (GEMM, FP8_GEMM):
            # beta != 0: the GEMM adds its product to a tensor it reads
            # (an add XLA folded into it).
            beta = re.search(r'"beta":([-\d.e]+)', line)
            adds = beta is not None and float(beta.group(1)) != 0
            # (result, [aux,] workspace): every array but the trailing
            # workspace is written (an epilogue's aux output, the
            # pre-activation it keeps for the backward pass, is a second
            # result). FLOPs are 2 per result element per contracted lhs
            # element.
            arrays = [f"{d}[{s}]" for d, s in ARRAY.findall(type_)]
            result = " ".join(arrays[:-1] if len(arrays) > 1 else arrays)
            dims = ARRAY.search(type_).group(2)  # the result's
            lhs = ARRAY.search(types[operands[0]]).group(2).split(",")
            contracting = re.search(
                r'"lhs_contracting_dimensions":\[([^\]]*)\]', line
            )
            flops = 2 * _product(dims.split(","))
            flops *= _product(
                lhs[int(a.strip('"'))] for a in contracting.group(1).split(",")
            )
        operand_bytes = sum(array_bytes(types.get(o, "")) for o in operands)
        found.append(
            {
                "kind": kind,
                "bytes": operand_bytes + array_bytes(result),
                "flops": flops,
                "adds": adds,
            }
        )
    return found


def summary(hlo, bandwidth):
    """A compiled module's counts (see the module docstring)."""
    found = kernels(hlo)
    gemms = [k for k in found if k["kind"] in (GEMM, FP8_GEMM)]
    other = [k for k in found if k["kind"] not in (GEMM, FP8_GEMM)]
    other_bytes = sum(k["bytes"] for k in other)
    windows = collections.Counter(
        re.findall(r'"sliding_window_length":\s*"?(\d+)', hlo)
    )
    return {
        "fp8_gemms": sum(k["kind"] == FP8_GEMM for k in gemms),
        "gemms_16bit": sum(k["kind"] == GEMM for k in gemms),
        "fp8_gemm_tflop": sum(
            k["flops"] for k in gemms if k["kind"] == FP8_GEMM
        )
        / 1e12,
        "gemm_16bit_tflop": sum(k["flops"] for k in gemms if k["kind"] == GEMM)
        / 1e12,
        "kernels_outside_gemms": len(other),
        # Kernels too small to fill the GPU: their launches, not their
        # bytes, are what they cost.
        "small_kernels_outside_gemms": sum(k["bytes"] < SMALL for k in other),
        "by_kind": dict(collections.Counter(k["kind"] for k in other)),
        # Fusions XLA emits through Triton (a softmax-like reduction and
        # its consumers in one kernel; GEMMs are off).
        "triton_fusions": hlo.count('"kind":"__triton"'),
        "gb_outside_gemms": other_bytes / 1e9,
        "ms_outside_gemms_at_bandwidth": other_bytes / bandwidth * 1e3,
        "gemm_operand_gb": sum(k["bytes"] for k in gemms) / 1e9,
        "gemms_adding_to_a_tensor": sum(k["adds"] for k in gemms),
        # cuBLASLt's epilogues by name (`BIAS_GELU_AUX`: the bias and a
        # GELU fused, the GELU's input written for the backward pass).
        "epilogues": dict(
            collections.Counter(re.findall(r'"epilogue":"([A-Z_]+)"', hlo))
        ),
        # cuDNN's fused attention calls (forward and backward) by mask
        # type: `CAUSAL` skips the blocks above the diagonal, `NO_MASK`
        # computes them all (a mask then comes as a bias).
        "attention_mask_types": dict(
            collections.Counter(re.findall(r'"mask_type":\s*"([A-Z_]+)"', hlo))
        ),
        # Their sliding windows (keys each query sees; 0: none), whose
        # blocks below the window cuDNN skips too, and how many have one.
        "attention_windows": dict(windows),
        "windowed_attention_calls": sum(
            count for window, count in windows.items() if window != "0"
        ),
    }
