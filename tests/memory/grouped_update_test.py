"""The 16-bit update on eager torch, a group of variables at a time
(`kmp.memory.grouped_update`): the groups' sizes change no bit, and the
result is the per-variable update's to a few bfloat16 steps."""

import keras
import numpy as np
import pytest

import kmp
from kmp import backend
from kmp.memory import grouped_update


def test_groups_hold_at_most_their_elements_in_order():
    variables = [
        keras.Variable(np.zeros(shape))
        for shape in ((2, 3), (4,), (8,), (1,), (3,))
    ]
    assert list(grouped_update.groups(variables, 10)) == [[0, 1], [2, 3], [4]]
    # One variable larger than a group is a group of its own.
    assert list(grouped_update.groups(variables, 5)) == [[0], [1], [2], [3, 4]]
    assert list(grouped_update.groups(variables, 100)) == [[0, 1, 2, 3, 4]]


def _grouped_run(
    monkeypatch, group_elements=None, in_groups=True, rounded_elements=None
):
    """Four AdamW steps of a 3-layer MLP under bfloat16 masters and
    state; the weights and slots after, and how many multi-tensor
    updates ran."""
    if group_elements is not None:
        monkeypatch.setattr(grouped_update, "GROUP_ELEMENTS", group_elements)
    if rounded_elements is not None:
        monkeypatch.setattr(
            grouped_update, "ROUNDED_ELEMENTS", rounded_elements
        )
    monkeypatch.setattr(backend, "updates_in_groups", lambda: in_groups)
    kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((8,)), *(keras.layers.Dense(8) for _ in range(3))]
    )
    optimizer = kmp.wrap(keras.optimizers.AdamW(1e-2, weight_decay=0.1))
    calls = []
    if in_groups:
        stock = type(optimizer)._parallel_update_step

        def counted(self, grads, variables, learning_rate):
            calls.append(len(variables))
            return stock(self, grads, variables, learning_rate)

        monkeypatch.setattr(type(optimizer), "_parallel_update_step", counted)
    model.compile(optimizer, "mse")
    rng = np.random.default_rng(0)
    x, y = rng.random((64, 8), "float32"), rng.random((64, 8), "float32")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    values = [
        keras.ops.convert_to_numpy(keras.ops.cast(v, "float32"))
        for v in [*model.weights, *optimizer.variables]
    ]
    return values, calls


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="only torch's optimizers update many variables in one call",
)
def test_on_torch_groups_of_variables_update_at_once(monkeypatch):
    # One group of all six weights, then one group per weight (a weight
    # of 8 elements fills a group of 8): the same bits.
    together, calls = _grouped_run(monkeypatch)
    assert calls == [6] * 4
    apart, calls = _grouped_run(monkeypatch, group_elements=8)
    assert calls == [1] * 6 * 4
    for a, b in zip(together, apart):
        np.testing.assert_array_equal(a, b)
    # One group, rounded a tensor or two per pass (18 tensors, in
    # passes of at most 72 elements): the same bits again.
    passes, calls = _grouped_run(
        monkeypatch, group_elements=2**22, rounded_elements=72
    )
    assert calls == [6] * 4
    for a, b in zip(together, passes):
        np.testing.assert_array_equal(a, b)
    # Variable by variable (Keras's per-variable update_step: the same
    # float32 arithmetic in another order, and the decay rounded apart
    # from the step): other draws of the rounding, a few bfloat16 steps
    # (2**-9 at 0.5) from the grouped run after four steps: 2**-7 exactly
    # on Keras 3.15.1, 0.0117 on 3.16's initial weights, so 2**-6.
    one_by_one, calls = _grouped_run(monkeypatch, in_groups=False)
    assert calls == []
    for a, b in zip(together, one_by_one):
        np.testing.assert_allclose(a, b, atol=2**-6)
