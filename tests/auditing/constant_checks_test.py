"""The audit's check of constants float16 cannot hold in a layer of the
user's (`kmp.auditing.constant_checks`): an additive attention mask
written with -1e9, which is NaN wherever it keeps a position, in stock
Keras's float16 too."""

import ast

import keras
import numpy as np
import pytest
from audit_util import has
from audit_util import quiet_audit
from keras import ops

import kmp
from kmp.auditing import constant_checks

WARNING = "computes with the constant -1e+09, beyond float16's range"


class MaskedAttention(keras.layers.Layer):
    """Attention whose mask is added as float32 code writes it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.query = keras.layers.Dense(8)
        self.key = keras.layers.Dense(8)

    def call(self, x, keep):
        scores = ops.matmul(
            self.query(x), ops.transpose(self.key(x), (0, 2, 1))
        )
        return ops.softmax(self._masked(scores, keep), axis=-1)

    def _masked(self, scores, keep):
        # Reached through `self`: the audit follows it.
        keep = ops.cast(keep, scores.dtype)
        return scores + (1.0 - keep) * -1e9


class SafelyMaskedAttention(MaskedAttention):
    def _masked(self, scores, keep):
        keep = ops.cast(keep, scores.dtype)
        return scores + (1.0 - keep) * -1e4


class ClippedScores(keras.layers.Layer):
    def call(self, x):
        return ops.clip(x, -1e9, 1e9)  # no arithmetic on the constant


def _model(layer):
    x = keras.Input((4, 8))
    keep = keras.Input((4, 4))
    scores = layer(x, keep) if isinstance(layer, MaskedAttention) else layer(x)
    out = keras.layers.Dense(1, dtype="float32")(keras.layers.Flatten()(scores))
    return keras.Model([x, keep], out)


def test_a_mask_of_minus_1e9_is_nan_in_float16_and_the_audit_says_so():
    kmp.enable("mixed_float16")
    layer = MaskedAttention()
    model = _model(layer)
    x = np.random.default_rng(0).normal(size=(2, 4, 8)).astype("float32")
    # The second example's every key masked: a row of -inf, NaN on every
    # backend (on TensorFlow and JAX the first's kept positions are
    # 0 * -inf too; torch multiplies float16 in float32); in float32 the
    # row is uniform.
    keep = np.stack([np.tril(np.ones((4, 4))), np.zeros((4, 4))])
    assert np.isnan(ops.convert_to_numpy(model([x, keep]))[1]).all()
    report = quiet_audit(model, optimizer=kmp.wrap("sgd"))
    assert has(report, WARNING, "warning")
    assert has(report, "MaskedAttention._masked")


@pytest.mark.parametrize(
    "policy, make",
    [
        ("mixed_bfloat16", MaskedAttention),  # bfloat16 holds 1e9
        ("mixed_float16", SafelyMaskedAttention),
        ("mixed_float16", ClippedScores),
    ],
)
def test_no_warning_where_float16_holds_it_or_no_arithmetic_uses_it(
    policy, make
):
    kmp.enable(policy)
    report = quiet_audit(_model(make()), optimizer=kmp.wrap("sgd"))
    assert not has(report, "beyond float16's range")


def test_large_operands_reads_signs_ints_and_leaves_calls_alone():
    tree = ast.parse(
        "def f(x, m):\n"
        "    y = x + (1 - m) * -1e9\n"
        "    z = ops.where(m, x, -3e38) - 7e4\n"
        "    y -= 100000\n"
        "    return ops.clip(y, -1e9, 1e9) * 2.0 + 65504.0\n"
    )
    # An int too: added to a float16 tensor, it is float16.
    assert constant_checks.large_operands(tree) == [-1e9, 7e4, 100000]
