"""The loss scaler's backend ops (`kmp.backend.scaler_ops`) on every
backend; torch's own bodies in detail: torch_step_test.py."""

import numpy as np
from keras import ops

from kmp import backend


def test_cond_takes_the_branch_its_predicate_says():
    yes = backend.cond(ops.convert_to_tensor(True), lambda: 1.0, lambda: 2.0)
    no = backend.cond(ops.convert_to_tensor(False), lambda: 1.0, lambda: 2.0)
    assert float(yes) == 1.0 and float(no) == 2.0


def test_fused_unscale_is_torch_s_and_elsewhere_left_to_xla():
    grads = [ops.convert_to_tensor([2.0, 4.0]), None]
    fused = backend.fused_unscale(grads, ops.convert_to_tensor(2.0))
    if backend.name() != "torch":
        assert fused is None
        return
    unscaled, finite = fused
    np.testing.assert_array_equal(ops.convert_to_numpy(unscaled[0]), [1, 2])
    assert unscaled[1] is None and bool(finite)


def test_own_values_are_copies_only_on_torch():
    values = [ops.convert_to_tensor([1.0, 2.0])]
    owned = backend.own_values(values)
    if backend.name() == "torch":
        assert owned[0] is not values[0]
    else:
        assert owned is values
    np.testing.assert_array_equal(
        ops.convert_to_numpy(owned[0]), ops.convert_to_numpy(values[0])
    )


def test_a_variable_is_held_by_the_step_only_when_jax_s_fit_emptied_it():
    # Outside a step every backend's variable has its value; inside
    # Keras's JAX fit it has none (tests/scaling/scaled_losses_test.py
    # runs that case).
    import keras

    variable = keras.Variable(1.0)
    assert not backend.held_by_the_step(variable)
    with keras.StatelessScope(state_mapping=[(variable, ops.ones(()))]):
        assert not backend.held_by_the_step(variable)
