"""kmp.auditing.softmax_checks: a softmax op in a 16-bit layer of the
user's, and Keras's `Attention` layers in 16 bits (keras-io's Swin
window attention, CCT's sequence pooling, Perceiver's cross-attention
write theirs so)."""

import ast

import keras
import pytest
from audit_util import has
from audit_util import quiet_audit
from keras import ops

import kmp
from kmp.auditing import softmax_checks
from kmp.auditing.source_reading import find_method


class WindowAttention(keras.layers.Layer):
    """keras-io's Swin's, reduced: its scores' softmax an op."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.qkv = keras.layers.Dense(24)

    def call(self, x):
        q, k, v = ops.split(self.qkv(x), 3, axis=-1)
        scores = ops.matmul(q, ops.transpose(k, (0, 2, 1)))
        return ops.matmul(self._attend(scores), v)

    def _attend(self, scores):
        return keras.activations.softmax(scores, axis=-1)


class CastsFirst(WindowAttention):
    def _attend(self, scores):
        probabilities = ops.softmax(ops.cast(scores, "float32"))
        return ops.cast(probabilities, self.compute_dtype)


def _model(layer):
    inputs = keras.Input((4, 8))
    x = layer(inputs)
    values = keras.layers.Dense(8)(inputs)
    x = keras.layers.Attention(name="keras_attention")([x, values])
    return keras.Model(inputs, keras.layers.Dense(2)(x))


def _findings(report, text):
    return [f for f in report if text in f.problem]


def test_a_softmax_op_in_a_16_bit_layer_is_a_warning():
    kmp.enable("mixed_float16")
    model = kmp.pin_float32(_model(WindowAttention(name="window")))
    (finding,) = _findings(quiet_audit(model), "WindowAttention._attend")
    assert finding.severity == "warning"
    assert finding.where == "window"
    assert finding.problem.startswith(
        "WindowAttention._attend computes keras.activations.softmax(...) in "
        "float16: an op, not a layer"
    )
    assert finding.fix.endswith(
        "kmp.pin_float32(model, also=[WindowAttention])."
    )
    # The fix's second form: the layer in float32, nothing to say.
    kmp.pin_float32(model, also=[WindowAttention])
    assert not _findings(quiet_audit(model), "WindowAttention")


def test_keras_s_attention_layer_in_16_bits_is_a_warning():
    kmp.enable("mixed_bfloat16")
    model = kmp.pin_float32(_model(CastsFirst()))
    report = quiet_audit(model)
    (finding,) = _findings(report, "score softmax")
    assert finding.where == "keras_attention"
    assert finding.problem.startswith(
        "Attention computes its score softmax in bfloat16"
    )
    assert "also=['keras_attention']" in finding.fix
    assert not has(report, "CastsFirst")  # it casts to float32 first
    # Keras's own code is not read for ops: the layer is said once.
    assert len(_findings(report, "Attention")) == 1
    kmp.pin_float32(model, also=["keras_attention"])
    assert not _findings(quiet_audit(model), "score softmax")


def test_float32_layers_and_library_layers_say_nothing():
    keras.config.set_dtype_policy("float32")
    assert not _findings(quiet_audit(_model(WindowAttention())), "softmax")
    kmp.enable("mixed_float16")
    model = kmp.pin_float32(
        _model(WindowAttention(dtype="float32", name="window"))
    )
    assert not _findings(quiet_audit(model), "WindowAttention")


@pytest.mark.parametrize(
    "source, found",
    [
        ("keras.ops.softmax(x)", ["keras.ops.softmax"]),
        ("ops.log_softmax(x, axis=-1)", ["ops.log_softmax"]),
        ("tf.nn.softmax(x)", ["tf.nn.softmax"]),
        ("ops.softmax(ops.cast(x, 'float32'))", []),
        ("tf.nn.softmax(tf.cast(x, tf.float32))", []),
        ("ops.softmax(ops.cast(x, 'float16'))", ["ops.softmax"]),
        ("ops.softmax((x * 2).astype('float32'))", []),
        ("tf.nn.softmax(tf.cast(x * 2, 'float32'))", []),
        ("x.softmax(-1)", []),  # a tensor's method: no module to read
        ("mine.softmax(x)", []),  # not a framework's
    ],
)
def test_which_calls_count(source, found):
    import tensorflow as tf

    class Mine:  # a module of the user's own would read as theirs too
        @staticmethod
        def softmax(x):
            return x

    code = f"def method(self, x):\n    return {source}\n"
    namespace = {"keras": keras, "ops": ops, "tf": tf, "mine": Mine()}
    exec(code, namespace)  # made here: a function with no source file

    class Holder:
        method = namespace["method"]

    method = find_method(Holder, "method")._replace(
        tree=ast.parse(code).body[0]
    )
    assert softmax_checks.softmax_ops(method) == found
