"""What XLA compiles for a GPU, read on a CPU: the kernels of a step.

    JAX=$(python -c "import jax; print(jax.__version__)")
    pip install "jax-cuda12-plugin==$JAX" "jax-cuda12-pjrt==$JAX"
    KERAS_BACKEND=jax python benchmarks/gpu_compile.py
    KERAS_BACKEND=jax python benchmarks/gpu_compile.py --programs stack \
        --sizes 8192 --target h200

XLA compiles a jitted step for a GPU this machine does not have: JAX's
deviceless compilation (`jax.experimental.topologies`, a topology of one
device described by a target config: compute capability 9.0, an H100
SXM as XLA's own tests describe it, or an H200, the same chip with its
memory). The compiled HLO lists the kernels the GPU would run, and this
script counts them per variant:

- the GEMMs by library call: `__cublas$lt$matmul$f8` (cuBLASLt's FP8
  GEMM) and `__cublas$lt$matmul` (its 16-bit one), with their FLOPs;
- the kernels outside the GEMMs (fusions, copies), with the bytes each
  reads and writes (each operand and its result once: what a kernel
  must move at least) and what those bytes take at the target's memory
  bandwidth, a lower bound on those kernels' time; and how many of them
  move less than 64 KB (scalars, an amax's second pass), whose launches
  cost more than their bytes.

The counting is `hlo_kernels.py`'s. Programs: `stack`, the step of
`float8_matmul.py` (a stack of square kernels, loss and gradients) in
bfloat16, with kmp's float8 matmul and with the other forms of its GEMM
that `float8_matmul.py --forms` times; `lm`, the train step of
`lm_speed.py` (KerasHub's GPT-2, AdamW under `kmp.wrap`, donated state
as Keras's `fit` compiles it) in bfloat16 and with `kmp.float8`,
compiled at `layers` and `layers - 1` decoder blocks, so that the
difference is one block's; `quantize`, one activation's quantization
alone, with one scale for the tensor (kmp's) or one per row, whose amax
and cast XLA can fuse into one kernel; `layout`, the smallest step with
a position table's gradient (a lookup, the table added over the batch,
a LayerNorm, a matmul) at several batch sizes, the table added as
KerasHub adds it or by `kmp.backend.broadcast_over_batch`, with how
often the compiled program names the batch-innermost shape `[sequence,
width, batch]` (fused computations' instructions included);
`activation`, a feed-forward block's step (a matmul, a bias, an
activation, a matmul) with GELU, ReLU or SiLU, differentiated as
written or recomputed in the backward pass
(`kmp.backend.recompute_in_backward`), with the cuBLASLt epilogues
XLA fused into its GEMMs (`epilogues`, recorded for every program);
`norm`, two pre-norm blocks' step (a LayerNorm, a matmul, the residual
add) with the LayerNorm as Keras writes it, recomputed in the backward
pass, with a one-pass variance, or in the form XLA's cuDNN LayerNorm
rewriter matches, without and with that rewriter, with how many cuDNN
LayerNorm calls XLA made (`cudnn_norms`); `llama`, the train step of
KerasHub's Llama (width 2048, 16 query heads, 4 key/value heads, feed
forward 5632, batch 8 x 1024, `mixed_bfloat16`, pinned, AdamW under
`kmp.wrap`, donated state) at 2 and 1 decoder blocks, with its decoders
telling their attention that the mask is causal
(`kmp.islands.attend_causally`, as `kmp.pin_float32` does on JAX) and
with KerasHub's mask alone (`hubcausal`), cuDNN's fused attention in both,
and told with its keys and values passed grouped (`ungrouped`: a slice
that takes one of each of KerasHub's repeats, which XLA folds away);
`gemma`, the same for KerasHub's Gemma 3 text backbone in its 1B
model's shape (width 1152, 4 query heads, 1 key/value head of 256,
feed forward 6912, post-norms, a sliding window of 512 tokens; a
vocabulary of 32,000 as `llama`'s, not its 262,144) at 2 and 1 blocks
(both windowed, as five of each six are), `pinned` and `hubcausal`,
its attention taking KerasHub's fused call as on a GPU (KerasHub asks
for one before it; this machine has none). With `--cudnn 9.10.2` (the
target's cuDNN; 9.8 by default), from which cuDNN takes a sliding
window beside a mask, `pinned` tells cuDNN the window too
(`kmp.backend.causal_attention`; on a GPU kmp compiles that attention
alone first, here answered yes): each record counts cuDNN's attention
calls by window (`attention_windows`, `windowed_attention_calls`).

What it cannot say: time. And XLA decides some things only on the
device: autotuning, which picks each GEMM's kernel by timing it, is off
here, and so are Triton's GEMMs (without autotuning XLA would hand every
dot to an untuned Triton kernel). Every dot goes to cuBLAS, as on the
H200 for kmp's float8 matmul at kernels of 2048 and up (12 of 12 FP8
GEMMs, `benchmarks/results/h200_2026-11-28/float8_matmul_jax.json`), but
not for XLA's dequantize-then-dot pattern, which the H200's autotuned
Triton GEMMs took (0 FP8 GEMMs there). The XLA is this machine's
jaxlib's. The `lm` program's attention is XLA's in `nodrop` variants;
in `flash` ones it is cuDNN's fused attention: JAX asks the machine's
cuDNN and GPU before emitting its custom calls, and here the target
answers (cuDNN 9.8, compute capability 9.0, as its config says). XLA
builds those kernels only on the device; they count among the kernels
outside the GEMMs, with the bytes of their operands and results.
"""

import argparse
import functools
import os

os.environ.setdefault("KERAS_BACKEND", "jax")
# The CPU runs the program builders (Keras builds its variables there);
# the compiles target the described GPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Deviceless: no autotuning, and every dot to cuBLAS (the docstring).
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_gpu_autotune_level=0 --xla_gpu_enable_triton_gemm=false"
)

import common  # noqa: E402
import hlo_kernels  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

# The H100 SXM as XLA's own deviceless tests describe it (compute
# capability 9.0, 132 SMs, 3.35 TB/s); the H200 is the same chip with
# 141 GB at 4.8 TB/s (NVIDIA's figures).
H100 = {
    "threads_per_block_limit": 1024,
    "threads_per_warp": 32,
    "shared_memory_per_block": 49152,
    "shared_memory_per_core": 233472,
    "threads_per_core_limit": 2048,
    "core_count": 132,
    "fpus_per_core": 128,
    "block_dim_limit_x": 2147483647,
    "block_dim_limit_y": 65535,
    "block_dim_limit_z": 65535,
    "memory_bandwidth": 3352320000000,
    "l2_cache_size": 52428800,
    "clock_rate_ghz": 1.98,
    "device_memory_size": 84929347584,
    "shared_memory_per_block_optin": 232448,
    "registers_per_core_limit": 65536,
    "registers_per_block_limit": 65536,
}
TARGETS = {
    "h100": ("NVIDIA H100 80GB HBM3", H100),
    "h200": (
        "NVIDIA H200",
        dict(
            H100,
            memory_bandwidth=4_800_000_000_000,
            device_memory_size=141_000_000_000,
        ),
    ),
}

# float8_matmul.py's matmuls and --forms: kmp's float8 matmul as it is
# (its GEMM writes bfloat16), as it was (float32), XLA's pattern, and
# without amax passes (a bound).
STACK_VARIANTS = (
    "bf16",
    "float8",
    "float8 out32",
    "float8 dequantized",
    "float8 noamax",
)

# lm_speed.py's variants, a float8 one optionally followed by a space and
# one of float8_matmul.py's forms.
LM_VARIANTS = ",".join(
    (
        "bf16+nodrop",
        "bf16+nodrop+kmp.float8",
        "bf16+nodrop+kmp.float8 out32",
        "bf16+nodrop+kmp.float8 noamax",
    )
)

# The batch of each width in the H200's lm_speed.py runs (2026-11-28).
LM_BATCH = {1024: 32, 2048: 16, 4096: 8}


def target_config(name, cudnn=(9, 8, 0)):
    """The GpuTargetConfig text of target `name` with cuDNN `cudnn`
    (major, minor, patch)."""
    description, info = TARGETS[name]
    fields = "".join(f"  {key}: {value}\n" for key, value in info.items())
    major, minor, patch = cudnn
    dnn = f"major: {major} minor: {minor}" + (f" patch: {patch}" * bool(patch))
    return (
        "gpu_device_info {\n"
        f"{fields}"
        "  cuda_compute_capability { major: 9 }\n"
        "}\n"
        'platform_name: "CUDA"\n'
        f"dnn_version_info {{ {dnn} }}\n"
        "runtime_version { major: 12 minor: 8 }\n"
        f'device_description_str: "{description}"\n'
    )


def answer_cudnn_checks(cudnn=(9, 8, 0)):
    """Lets JAX emit cuDNN's fused attention for the target: its checks
    of the machine's cuDNN version and GPU (private functions of
    `jax._src.cudnn`, which Keras's flash check and
    `kmp.backend.causal_attention` call too) get the target's answers,
    cuDNN `cudnn` (9.8 unless `--cudnn` says) and compute capability
    9.0; and kmp's check that cuDNN compiles an attention with a sliding
    window on this machine (which has no GPU) says yes, as the target's
    cuDNN (9.10.2 or later) would where it supports the shapes."""
    from jax._src.cudnn import fused_attention_stablehlo as fused

    from kmp.backend import attention

    target = (9, 0)

    def capability(text):
        return tuple(int(v) for v in text.split("."))

    major, minor, patch = cudnn
    fused.check_cudnn_version = lambda: major * 10000 + minor * 100 + patch
    attention._compiles = lambda shapes, window: True
    fused.check_compute_capability = lambda c: target >= capability(c)
    fused.is_cuda_compute_capability_equal = lambda c: target == capability(c)


def gpu_device(name, cudnn=(9, 8, 0)):
    """The one device of a deviceless topology for target `name` with
    cuDNN `cudnn`."""
    from jax.experimental import topologies

    try:
        topology = topologies.get_topology_desc(
            platform="cuda",
            topology_name="",
            target_config=target_config(name, cudnn),
            topology="1x1x1",
        )
    except Exception as error:
        version = jax.__version__
        raise SystemExit(
            f"No deviceless CUDA compiler ({type(error).__name__}: {error}). "
            f"Install JAX's CUDA plugin of jax {version}: pip install "
            f'"jax-cuda12-plugin=={version}" "jax-cuda12-pjrt=={version}"'
        ) from None
    return topology.devices[0]


def abstract(device, shape, dtype):
    """An argument of `shape` and `dtype` on the target `device`, which
    XLA compiles for and nothing is allocated for."""
    sharding = jax.sharding.SingleDeviceSharding(device)
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def layout_programs(device, batches, sequence, width, vocabulary=256):
    """`(config, variant, compiled HLO)` of the smallest step with a
    position table's gradient: token ids looked up in a table, a position
    table added over the batch, a LayerNorm in float32 and a matmul, in
    bfloat16, differentiated. `broadcast_to`: the table added as KerasHub
    adds it (its gradient a sum over the batch); `broadcast_over_batch`:
    kmp's (from a batch of 32, a product whose gradient is a
    contraction)."""
    from kmp.backend import broadcast_over_batch

    def step(form):
        def loss(params, ids):
            table, positions, kernel = params
            x = jnp.take(table, ids, axis=0).astype(jnp.bfloat16)
            p = positions.astype(jnp.bfloat16)
            if form == "broadcast_to":
                x = x + p[None]
            else:
                x = x + broadcast_over_batch(p, ids.shape[0])
            h = x.astype(jnp.float32)
            mean = h.mean(-1, keepdims=True)
            h = (h - mean) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-5)
            y = h.astype(jnp.bfloat16) @ kernel.astype(jnp.bfloat16)
            return jnp.mean(jnp.square(y.astype(jnp.float32)))

        return jax.jit(jax.grad(loss))

    params = (
        abstract(device, (vocabulary, width), jnp.float32),
        abstract(device, (sequence, width), jnp.float32),
        abstract(device, (width, width), jnp.float32),
    )
    for batch in batches:
        ids = abstract(device, (batch, sequence), jnp.int32)
        for form in ("broadcast_to", "broadcast_over_batch"):
            hlo = step(form).lower(params, ids).compile().as_text()
            yield f"batch {batch}", form, hlo


def activation_programs(device, tokens, width, hidden):
    """`(config, variant, compiled HLO)` of a feed-forward block's step in
    bfloat16 (a matmul, a bias, an activation, a matmul, differentiated)
    for GELU (approximate and exact), ReLU and SiLU, each differentiated
    as written (`as written`) and recomputed from its input in the
    backward pass (`recomputed`, `kmp.backend.recompute_in_backward`)."""
    from kmp.backend import recompute_in_backward

    activations = {
        "gelu approximate": lambda x: jax.nn.gelu(x, approximate=True),
        "gelu exact": lambda x: jax.nn.gelu(x, approximate=False),
        "relu": jax.nn.relu,
        "silu": jax.nn.silu,
    }

    def step(activation):
        def loss(params, x):
            w1, b1, w2 = (p.astype(jnp.bfloat16) for p in params)
            y = activation(x @ w1 + b1) @ w2
            return jnp.mean(jnp.square(y.astype(jnp.float32)))

        return jax.jit(jax.grad(loss))

    params = (
        abstract(device, (width, hidden), jnp.float32),
        abstract(device, (hidden,), jnp.float32),
        abstract(device, (hidden, width), jnp.float32),
    )
    x = abstract(device, (tokens, width), jnp.bfloat16)
    config = f"{tokens} tokens, {width} -> {hidden} -> {width}"
    for name, activation in activations.items():
        for variant, function in (
            ("as written", activation),
            ("recomputed", recompute_in_backward(activation)),
        ):
            hlo = step(function).lower(params, x).compile().as_text()
            yield config, f"{name}, {variant}", hlo


def norm_programs(device, batch, sequence, width):
    """`(config, variant, compiled HLO)` of a step of two pre-norm blocks
    in bfloat16 (a LayerNorm in float32 over a bfloat16 residual, a
    matmul, the residual add), differentiated, its LayerNorm written as
    Keras computes it (`keras.ops.layer_normalization`), recomputed from
    its input in the backward pass (`jax.checkpoint`), with a one-pass
    variance (`E[x^2] - E[x]^2`), and in the form XLA's cuDNN LayerNorm
    rewriter matches (`(x - mean) * rsqrt(var + eps) * gamma + beta`),
    compiled without and with that rewriter
    (`xla_gpu_enable_cudnn_layer_norm`, off by default)."""
    from keras import ops

    def keras_form(x, gamma, beta):
        return ops.layer_normalization(x, gamma, beta, epsilon=1e-5)

    def one_pass(x, gamma, beta):
        h = x.astype(jnp.float32)
        mean = h.mean(-1, keepdims=True)
        variance = jnp.square(h).mean(-1, keepdims=True) - jnp.square(mean)
        scale = jax.lax.rsqrt(jnp.maximum(variance, 0.0) + 1e-5) * gamma
        return (h * scale + (beta - mean * scale)).astype(x.dtype)

    def cudnn_form(x, gamma, beta):
        h = x.astype(jnp.float32)
        mean = h.mean(-1, keepdims=True)
        variance = jnp.square(h - mean).mean(-1, keepdims=True)
        y = (h - mean) * jax.lax.rsqrt(variance + 1e-5) * gamma + beta
        return y.astype(x.dtype)

    forms = {
        "keras": (keras_form, None),
        "recomputed": (jax.checkpoint(keras_form), None),
        "one pass": (one_pass, None),
        "cudnn's form": (cudnn_form, None),
        "cudnn's form, cudnn flag": (
            cudnn_form,
            {"xla_gpu_enable_cudnn_layer_norm": True},
        ),
    }

    def step(norm):
        def loss(params, x):
            for gamma, beta, kernel in params:
                y = norm(x, gamma, beta) @ kernel.astype(jnp.bfloat16)
                x = x + y
            return jnp.mean(jnp.square(x.astype(jnp.float32)))

        return jax.jit(jax.grad(loss))

    block = (
        abstract(device, (width,), jnp.float32),
        abstract(device, (width,), jnp.float32),
        abstract(device, (width, width), jnp.float32),
    )
    x = abstract(device, (batch, sequence, width), jnp.bfloat16)
    config = f"2 blocks, {batch} x {sequence} x {width}"
    for variant, (norm, options) in forms.items():
        lowered = step(norm).lower([block, block], x)
        yield config, variant, lowered.compile(options).as_text()


def llama_program(device, layers, batch, sequence, variant):
    """The compiled HLO of KerasHub Llama's train step (the module
    docstring's `llama`), `variant` `pinned`, `hubcausal` or
    `ungrouped`."""
    import hub_attention_speed

    build = functools.partial(hub_attention_speed.llama, layers)
    return _hub_program(device, build, batch, sequence, variant)


def gemma_program(device, layers, batch, sequence, variant):
    """The compiled HLO of KerasHub Gemma 3's train step (the module
    docstring's `gemma`), `variant` `pinned` or `hubcausal`, its
    attention's fused call taken as on a GPU."""
    import hub_attention_speed

    build = functools.partial(hub_attention_speed.gemma, layers)
    return _hub_program(device, build, batch, sequence, variant)


def _hub_program(device, build, batch, sequence, variant):
    """The compiled HLO of the train step of the causal LM `build()`
    makes, as `hub_attention_speed.py` compiles it (pinned under
    `mixed_bfloat16`, AdamW under `kmp.wrap`); `variant` `hubcausal`
    undoes `attend_causally`, `ungrouped` passes the keys and values
    grouped."""
    import hub_attention_speed

    import kmp

    told = "hubcausal" if variant == "hubcausal" else "pinned"
    model = hub_attention_speed.compiled_model(build, told)
    for layer in model._flatten_layers():
        if variant == "ungrouped" and kmp.islands.attends_causally(layer):
            _ungroup(layer._self_attention_layer)
    return compiled_train_step(device, model, batch, sequence)


def _ungroup(attention):
    """Makes Llama's `attention` hand kmp's call its keys and values
    grouped, as its projections make them: KerasHub repeats each to
    `num_key_value_groups` query heads first, and a slice with that step
    takes one of each repeat (the `llama` program's `ungrouped`)."""
    told = attention._compute_attention
    groups = attention.num_key_value_groups

    def compute_attention(query, key, value, *args, **kwargs):
        key, value = key[:, :, ::groups], value[:, :, ::groups]
        return told(query, key, value, *args, **kwargs)

    attention._compute_attention = compute_attention


def batch_innermost(hlo, batch, sequence, width):
    """How often the program names an array laid out `[sequence, width,
    batch]`: the activations transposed batch-innermost."""
    return hlo.count(f"[{sequence},{width},{batch}]")


def quantize_programs(device, sizes, tokens):
    """`(config, variant, compiled HLO)` of one activation's quantization
    to E4M3 (`tokens` x `size`, bfloat16), alone: kmp's (one scale for
    the tensor), and a scale per row, with its scales returned (as a
    matmul's rescale needs them) or not."""
    from kmp.fp8.quantization import E4M3
    from kmp.fp8.quantization import FLOAT8_MAX
    from kmp.fp8.scaled_matmul import quantize

    limit = FLOAT8_MAX[E4M3]

    def per_row(x):
        """`quantize`'s rule, a scale per row (the floor: the smallest
        normal float32)."""
        x = x.astype(jnp.float32)
        scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / limit
        scale = jnp.maximum(scale, 2.0**-126)
        return jnp.clip(x / scale, -limit, limit).astype(E4M3), scale

    variants = {
        "per tensor": lambda x: quantize(x, E4M3),
        "per row": per_row,
        "per row, no scales out": lambda x: per_row(x)[0],
    }
    for size in sizes:
        x = abstract(device, (tokens, size), jnp.bfloat16)
        for variant, function in variants.items():
            hlo = jax.jit(function).lower(x).compile().as_text()
            yield f"{tokens} x {size}", variant, hlo


def stack_programs(device, sizes, tokens, layers):
    """`(config, variant, compiled HLO)` of float8_matmul.py's step."""
    import float8_matmul

    for size in sizes:
        x = abstract(device, (tokens, size), jnp.bfloat16)
        w = abstract(device, (size, size), jnp.bfloat16)
        for variant in STACK_VARIANTS:
            matmul = float8_matmul.MATMULS[variant.split()[0]]
            step = float8_matmul.train_step(matmul)
            with float8_matmul._form(variant):
                hlo = step.lower(x, [w] * layers).compile().as_text()
            yield f"{layers} x {size}^2, {tokens} tokens", variant, hlo


def lm_program(device, hidden, layers, batch, sequence, variant):
    """The compiled HLO of lm_speed.py's train step for one variant."""
    import float8_matmul
    import keras
    import lm_speed

    import kmp
    from kmp.examples import lm

    config = lm.Config(
        hidden_dim=hidden,
        heads=max(hidden // 128, 1),
        layers=layers,
        sequence_length=sequence,
        batch_size=batch,
        data="synthetic",
    )
    with kmp.policy_scope(lm_speed.POLICY):
        keras.utils.set_random_seed(0)
        model, _ = lm_speed.compile_variant(
            config, lm_speed.parse_variant(variant.partition(" ")[0]), 10
        )
    with float8_matmul._form(variant):
        return compiled_train_step(device, model, batch, sequence)


def compiled_train_step(device, model, batch, sequence):
    """The compiled HLO of compiled causal LM `model`'s train step on
    `batch` x `sequence` token ids (its state donated, as Keras's `fit`
    compiles it); clears Keras's session after."""
    import keras
    import lm_speed

    state = jax.tree.map(
        lambda v: abstract(device, v.shape, v.dtype),
        lm_speed.train_state(model),
    )
    tokens = abstract(device, (batch, sequence), "int32")
    mask = abstract(device, (batch, sequence), "bool")
    data = ({"token_ids": tokens, "padding_mask": mask}, tokens)
    step = jax.jit(model.train_step, donate_argnums=0)
    hlo = step.lower(state, data).compile().as_text()
    keras.backend.clear_session()
    return hlo


def _packages():
    """The versions of the compiler's packages."""
    from importlib import metadata

    names = ("jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "keras-hub")
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def per_block(whole, fewer):
    """One decoder block's share: `whole` minus `fewer` (one block less)."""
    out = {}
    for key, value in whole.items():
        if isinstance(value, dict):
            keys = set(value) | set(fewer[key])
            out[key] = {
                k: value.get(k, 0) - fewer[key].get(k, 0) for k in sorted(keys)
            }
        else:
            out[key] = value - fewer[key]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", choices=sorted(TARGETS), default="h200")
    parser.add_argument(
        "--programs",
        default="stack,lm,quantize",
        help="comma-separated: stack, lm, quantize, layout, activation, "
        "norm, llama, gemma",
    )
    parser.add_argument(
        "--batches",
        default="16,31,32,64",
        help="the layout program's batch sizes",
    )
    parser.add_argument(
        "--sizes", default="2048,4096,8192", help="the stack's kernel sizes"
    )
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=4, help="the stack's")
    parser.add_argument(
        "--configs",
        default="2048x2,4096x2",
        help="the LM's HIDDENxLAYERS or HIDDENxLAYERSxBATCH (layers >= 2: "
        "a block is the difference with one block less)",
    )
    parser.add_argument(
        "--batch_size",
        type=int,
        default=0,
        help=f"the LM's; 0: by width, as the H200 ran it {LM_BATCH}",
    )
    parser.add_argument("--sequence_length", type=int, default=512)
    parser.add_argument("--variants", default=LM_VARIANTS, help="the LM's")
    parser.add_argument(
        "--cudnn",
        default="9.8.0",
        help="the target's cuDNN (a sliding window beside a mask: 9.10.2)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    programs = [p for p in args.programs.split(",") if p]
    known = {
        "stack",
        "lm",
        "quantize",
        "layout",
        "activation",
        "norm",
        "llama",
        "gemma",
    }
    unknown = sorted(set(programs) - known)
    if unknown:
        parser.error(f"--programs takes {sorted(known)}; got {unknown}")
    cudnn = tuple(args.cudnn.split("."))
    if len(cudnn) != 3 or not all(v.isdigit() for v in cudnn):
        parser.error(f"--cudnn takes MAJOR.MINOR.PATCH; got {args.cudnn!r}")
    cudnn = tuple(int(v) for v in cudnn)
    device = gpu_device(args.target, cudnn)
    bandwidth = TARGETS[args.target][1]["memory_bandwidth"]
    print(
        f"target: {TARGETS[args.target][0]} ({device}), jax {jax.__version__}"
    )
    records = []
    result = {
        "benchmark": "gpu_compile",
        "target": args.target,
        "target_config": target_config(args.target, cudnn),
        "xla_flags": os.environ["XLA_FLAGS"].strip(),
        "packages": _packages(),
        "records": records,
    }
    filename = f"gpu_compile_{args.target}.json"

    def add(program, config, variant, counts):
        record = {
            "program": program,
            "config": config,
            "variant": variant,
            **counts,
        }
        records.append(record)
        print(
            f"{program} {config} {variant}: {counts['fp8_gemms']} FP8 GEMMs, "
            f"{counts['gemms_16bit']} 16-bit, "
            f"{counts['kernels_outside_gemms']} "
            f"other kernels moving {counts['gb_outside_gemms']:.3f} GB",
            flush=True,
        )
        common.write_result(result, filename, args.out)

    if "quantize" in programs:
        sizes = [int(s) for s in args.sizes.split(",")]
        for config, variant, hlo in quantize_programs(
            device, sizes, args.tokens
        ):
            add(
                "quantize", config, variant, hlo_kernels.summary(hlo, bandwidth)
            )
    if "layout" in programs:
        batches = [int(b) for b in args.batches.split(",")]
        width = 1024
        for config, variant, hlo in layout_programs(
            device, batches, args.sequence_length, width
        ):
            batch = int(config.split()[-1])
            counts = hlo_kernels.summary(hlo, bandwidth)
            counts["batch_innermost"] = batch_innermost(
                hlo, batch, args.sequence_length, width
            )
            add("layout", f"{config}, width {width}", variant, counts)
    if "stack" in programs:
        sizes = [int(s) for s in args.sizes.split(",")]
        for config, variant, hlo in stack_programs(
            device, sizes, args.tokens, args.layers
        ):
            add("stack", config, variant, hlo_kernels.summary(hlo, bandwidth))
    if "activation" in programs:
        # The feed-forward block of the LM at width 1024, batch 32 x 512.
        for config, variant, hlo in activation_programs(
            device, 32 * 512, 1024, 4096
        ):
            add(
                "activation",
                config,
                variant,
                hlo_kernels.summary(hlo, bandwidth),
            )
    if "norm" in programs:
        # The LM's residual stream at width 1024, batch 32 x 512.
        for config, variant, hlo in norm_programs(device, 32, 512, 1024):
            counts = hlo_kernels.summary(hlo, bandwidth)
            counts["cudnn_norms"] = hlo.count('"__cudnn$norm"')
            add("norm", config, variant, counts)
    # KerasHub's own decoders: each program's variants, a block's width.
    hub_programs = {
        "llama": (llama_program, ("pinned", "hubcausal", "ungrouped"), 2048),
        "gemma": (gemma_program, ("pinned", "hubcausal"), 1152),
    }
    for name, (program, variants, width) in hub_programs.items():
        if name not in programs:
            continue
        answer_cudnn_checks(cudnn)
        batch, sequence = 8, 1024
        for variant in variants:
            counts = [
                hlo_kernels.summary(
                    program(device, n, batch, sequence, variant), bandwidth
                )
                for n in (2, 1)
            ]
            record = dict(counts[0], per_block=per_block(*counts))
            config = f"width {width}, 2 blocks, batch {batch} x {sequence}"
            add(name, config, variant, record)
    if "lm" in programs:
        if any("flash" in v for v in args.variants.split(",")):
            answer_cudnn_checks(cudnn)
        for text in args.configs.split(","):
            hidden, layers, *batch = (int(v) for v in text.lower().split("x"))
            if layers < 2 or len(batch) > 1:
                parser.error(
                    f"--configs: {text!r} is not HIDDENxLAYERS[xBATCH] with "
                    "2 layers or more"
                )
            batch = (batch or [args.batch_size or LM_BATCH.get(hidden, 8)])[0]
            for variant in args.variants.split(","):
                counts = []
                for n in (layers, layers - 1):
                    hlo = lm_program(
                        device, hidden, n, batch, args.sequence_length, variant
                    )
                    counts.append(hlo_kernels.summary(hlo, bandwidth))
                record = dict(counts[0], per_block=per_block(*counts))
                add("lm", f"{hidden}x{layers}, batch {batch}", variant, record)


if __name__ == "__main__":
    main()
