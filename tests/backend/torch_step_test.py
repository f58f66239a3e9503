"""kmp.LossScaleOptimizer's step on torch (`kmp.backend._torch_step`), through
the `kmp.backend` functions that pick it: what each does on torch, and
that the other backends keep their own way."""

import keras
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from keras import ops
from util import torch_only

from kmp import backend


def test_cond_takes_the_branch_its_tensor_says():
    def branch(value):
        return lambda: ops.convert_to_tensor(value)

    for flag, taken in ((True, 1), (False, 0)):
        pred = ops.convert_to_tensor(flag)
        assert int(backend.cond(pred, branch(1), branch(0))) == taken


def test_own_values_are_copies_only_where_updates_are_in_place():
    values = [keras.Variable([1.0, 2.0]).value]
    owned = backend.own_values(values)
    if backend.name() != "torch":
        assert owned is values  # immutable arrays: nothing to copy
        return
    owned[0].add_(1.0)  # what a torch optimizer does to its inputs
    np.testing.assert_array_equal(ops.convert_to_numpy(values[0]), [1, 2])


@given(
    st.lists(
        st.sampled_from(["float32", "float16", None]), min_size=1, max_size=4
    ),
    st.integers(0, 24),
    st.sampled_from([None, np.inf, -np.inf, np.nan]),
)
def test_fused_unscale_is_the_division_and_the_check(dtypes, exponent, bad):
    scale = ops.convert_to_tensor(2.0**exponent, "float32")
    rng = np.random.default_rng(exponent)
    grads = [
        None
        if dtype is None
        else ops.convert_to_tensor(
            rng.normal(size=(3, 5)) * 2.0 ** (exponent % 12), dtype
        )
        for dtype in dtypes
    ]
    present = [i for i, g in enumerate(grads) if g is not None]
    if bad is not None and present:
        index = present[-1]
        values = ops.convert_to_numpy(grads[index]).copy()
        values[1, 2] = bad
        grads[index] = ops.convert_to_tensor(values)
    given = [None if g is None else ops.convert_to_numpy(g) for g in grads]
    fused = backend.fused_unscale(grads, scale)
    if backend.name() != "torch":
        assert fused is None  # XLA fuses it there
        return
    unscaled, finite = fused
    assert bool(finite) == (bad is None or not present)
    for g, u, before in zip(grads, unscaled, given):
        if g is None:
            assert u is None
            continue
        np.testing.assert_array_equal(ops.convert_to_numpy(g), before)
        # float32 (or wider), as TensorFlow's division gives: a float16
        # gradient unscaled in float16 could underflow.
        assert keras.backend.standardize_dtype(u.dtype) == "float32"
        if bad is None:  # a power-of-two scale: the exact quotient
            np.testing.assert_array_equal(
                ops.convert_to_numpy(u),
                (before.astype("float64") / 2.0**exponent).astype("float32"),
            )


@torch_only
def test_fused_unscale_copies_a_dtype_s_gradients_in_one_op():
    # On eager torch each op is a trip through Python: a copy per
    # gradient cost ResNet-9's float16 step 52 of its 535 ops. However many
    # float32 gradients, the ops are the same few; a float16 one adds
    # its own cast.
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls[str(func)] += 1
            return func(*args, **(kwargs or {}))

    scale = ops.convert_to_tensor(4.0)
    counts = {}
    for n in (1, 8):
        grads = [ops.ones((3,)) for _ in range(n)]
        calls = collections.Counter()
        with Count():
            unscaled, finite = backend.fused_unscale(grads, scale)
        counts[n] = calls
        assert bool(finite)
        for g, u in zip(grads, unscaled):
            assert u is not g and u.data_ptr() != g.data_ptr()
            np.testing.assert_array_equal(ops.convert_to_numpy(u), 0.25)
            np.testing.assert_array_equal(ops.convert_to_numpy(g), 1.0)
    assert counts[1] == counts[8]
    assert counts[8]["aten._foreach_mul.Scalar"] == 1
    assert "aten._to_copy.default" not in counts[8]


@torch_only
def test_fused_unscale_leaves_a_non_real_gradient_to_the_unfused_path():
    import torch

    grads = [ops.ones((3,)), torch.ones(3, dtype=torch.complex64)]
    assert backend.fused_unscale(grads, ops.convert_to_tensor(2.0)) is None
