"""kmp.backend.policy_hooks: what kmp wraps in Keras while a 16-bit kmp
policy is in force, and Keras's methods put back otherwise."""

import keras
import numpy as np

import kmp
from kmp import backend
from kmp.backend import policy_hooks


class Mixes(keras.layers.Layer):
    """A user's layer that mixes its float16 input with a float32 draw in
    an op that does not promote (TensorFlow's `*` on its tensors, torch's
    matmul), or promotes (JAX): an error on the first two."""

    def call(self, x):
        noise = keras.random.normal(keras.ops.shape(x))  # float32
        return keras.ops.matmul(x, keras.ops.transpose(noise))


def test_the_hooks_are_in_place_only_under_a_16_bit_kmp_policy():
    original = keras.layers.Layer.__dict__["_open_name_scope"]
    fit = keras.Model.fit
    kmp.enable("mixed_bfloat16")
    assert backend.dtype_notes_on()
    assert keras.layers.Layer._open_name_scope is not original
    kmp.disable()
    assert not backend.dtype_notes_on()
    assert keras.layers.Layer.__dict__["_open_name_scope"] is original
    assert keras.Model.fit is fit and "fit" not in keras.Model.__dict__
    with kmp.policy_scope("mixed_float16"):
        assert backend.dtype_notes_on()
    assert not backend.dtype_notes_on()
    # Keras's policy set directly: nothing of kmp's in place.
    keras.config.set_dtype_policy("mixed_float16")
    assert not backend.dtype_notes_on()
    assert keras.layers.Layer.__dict__["_open_name_scope"] is original
    try:
        Mixes()(np.ones((2, 2), "float32"))
    except Exception as error:  # TensorFlow and torch refuse; JAX promotes
        notes = getattr(error, "__notes__", [])
        assert not [n for n in notes if n.startswith("kmp: ")]


def test_while_16_bit_wraps_a_registered_method_on_the_same_switch():
    class Owner:
        def method(self):
            return "keras's"

    def wrap(method):
        def wrapper(self):
            return "kmp's over " + method(self)

        wrapper._kmp_original = method
        return wrapper

    original = Owner.__dict__["method"]
    try:
        backend.while_16_bit(Owner, "method", wrap)
        backend.while_16_bit(Owner, "method", wrap)  # once, not twice
        assert policy_hooks._OTHERS.count((Owner, "method", wrap)) == 1
        assert Owner().method() == "keras's"  # registered, not yet on
        kmp.enable("mixed_float16")
        assert Owner().method() == "kmp's over keras's"
        kmp.enable("float32")
        assert Owner.__dict__["method"] is original
        # A wrapper of someone else's put over kmp's (a test's spy) is
        # left as it is when kmp's switch goes off.
        kmp.enable("mixed_float16")
        spy = Owner.__dict__["method"]
        Owner.method = lambda self: "spy over " + spy(self)
        kmp.disable()
        assert Owner().method() == "spy over kmp's over keras's"
    finally:
        policy_hooks._OTHERS.remove((Owner, "method", wrap))
