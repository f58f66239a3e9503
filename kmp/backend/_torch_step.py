"""kmp.LossScaleOptimizer's step on torch: three torch-only bodies that
`kmp.backend` picks (`cond`, `fused_unscale`, `own_values`); this module
branches on nothing.

Keras runs its torch backend eagerly, op by op, so what XLA fuses or
makes free on TensorFlow and JAX costs here: a host sync per tensor read,
a kernel per op, an operation object per `ops.cond`. BUILD_NOTES.md
(defects 19-22) has the measurements.
"""

import torch
from keras import ops


def cond(pred, true_fn, false_fn):
    """A Python `if` on a boolean tensor.

    Keras's torch `cond` is that `if` already, but `ops.cond` first builds
    a `Cond` operation with a fresh name on every call, and torch.compile
    guards on the name counter: the function holding the `cond` is
    recompiled on every step until dynamo's recompile limit (8) makes it
    run uncompiled (`tests/loss_scale_optimizer_test.py` counts them).
    """
    return true_fn() if bool(pred) else false_fn()


def fused_unscale(grads, scale):
    """`(grads / scale, all finite)` in one fused pass, on CPU and CUDA.

    Keras's scaler checks and divides each gradient with ops of its own:
    per gradient, an `isfinite`, an `all` and a divide, each a pass over
    the gradient and, on a GPU, a kernel launch. PyTorch's `GradScaler`
    does both in one multi-tensor kernel,
    `torch._amp_foreach_non_finite_check_and_unscale_`; on a 2-core CPU
    it took 0.26 ms instead of 3.5 ms for a 512-wide MLP's gradients.
    The kernel works in place, and Keras treats gradients as read-only,
    so it runs on copies, made by one multi-tensor op too: on eager torch
    every op is a kernel launch and a trip through Python, and a copy
    per gradient cost ResNet-9's float16 step 52 of its 535 aten calls
    (`benchmarks/torch_amp.py`). It tests the scaled gradients, as every
    backend's `check_finite` does, and multiplies by the reciprocal of
    the scale (as `GradScaler`): exact for a power-of-two scale (every
    scale kmp's default rule reaches), within an ulp otherwise.

    Returns:
        `(unscaled, finite)`, or `None` on a device or for a dtype the
        kernel does not serve (the caller then takes the unfused path).
    """
    scale = ops.convert_to_tensor(scale)
    if scale.device.type not in ("cpu", "cuda"):
        return None
    found = torch.zeros((), dtype=torch.float32, device=scale.device)
    inverse = torch.reciprocal(scale.to(torch.float32))
    groups = {}  # the kernels take one device and dtype per call
    for i, g in enumerate(grads):
        if g is not None:
            if not g.dtype.is_floating_point:  # complex, say: not its kernel
                return None
            groups.setdefault((g.device, g.dtype), []).append(i)
    unscaled = list(grads)
    for (_, dtype), indices in groups.items():
        group = [grads[i] for i in indices]
        if dtype in (torch.float32, torch.float64):
            copies = torch._foreach_mul(group, 1.0)  # new tensors, one op
        else:
            # float32 copies of 16-bit gradients (of 16-bit variables):
            # the unscaled values, often tiny, would underflow in 16 bits.
            copies = [g.to(torch.float32, copy=True) for g in group]
        torch._amp_foreach_non_finite_check_and_unscale_(copies, found, inverse)
        for i, copy in zip(indices, copies):
            unscaled[i] = copy
    return unscaled, found == 0


def own_values(values):
    """Copies of `values` for a stateless update to change.

    Keras's torch optimizers update the tensors a `stateless_apply` is
    given in place (`torch._foreach_*_` inside a StatelessScope); when
    those are the variables' own values, the "stateless" call changes
    the model.
    """
    return [ops.copy(v) for v in values]
