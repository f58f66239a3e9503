"""The audit's environment checks (`kmp.auditing.environment_checks`),
through `kmp.audit`: hardware, TF32, XLA and an active distribution."""

import keras
import numpy as np
import pytest
from audit_util import compiled_for_audit
from audit_util import has
from audit_util import quiet_audit
from audit_util import small_mlp
from util import jax_only
from util import tf_only

import kmp
from kmp import backend
from kmp import policy as policy_lib
from kmp.backend import Device


def test_environment_findings(monkeypatch):
    kmp.enable("mixed_float16")
    model = compiled_for_audit(kmp.pin_float32(small_mlp()))
    monkeypatch.setattr(policy_lib, "_logged_reasons", set())
    monkeypatch.setattr(backend, "list_devices", lambda: [Device("cpu", "x")])
    report = quiet_audit(model)
    assert has(report, "environment|Mixed precision on hardware", "warning")
    assert has(report, f"{backend.step_compiler()} is on", "info")
    # A CPU has no TF32, whatever TensorFlow's setting says.
    assert not has(report, "TF32")
    monkeypatch.setattr(
        backend, "list_devices", lambda: [Device("gpu", "A100", (8, 0))]
    )
    assert not has(quiet_audit(model), "Mixed precision on hardware")
    assert has(quiet_audit(model), "TF32 for float32 matmuls", "info")
    monkeypatch.setattr(
        backend, "list_devices", lambda: [Device("gpu", "T4", (7, 5))]
    )
    assert not has(quiet_audit(model), "TF32")
    model.compile(optimizer=kmp.wrap("adam"), loss="mse", jit_compile=False)
    if backend.name() == "torch":
        assert has(
            quiet_audit(model), "runs eagerly (jit_compile=False", "info"
        )
    else:
        assert has(quiet_audit(model), "without XLA", "warning")


class OwnAttention(keras.layers.Layer):
    """A layer of the user's that calls Keras's fused attention."""

    def call(self, x):
        return keras.ops.dot_product_attention(x, x, x)


class DecidesItself(OwnAttention):
    """KerasHub's habit: the fused op where `_use_fused_attention_op()`
    says (Gemma's says no on a CPU, and runs)."""

    def _use_fused_attention_op(self):
        return False

    def call(self, x):
        if self._use_fused_attention_op():
            return keras.ops.dot_product_attention(x, x, x)
        return x


def _attention_model(dropout):
    x = keras.Input((4, 2, 8))
    h = keras.layers.MultiHeadAttention(2, 4, dropout=dropout, name="mha")(
        keras.layers.Reshape((8, 8))(x), keras.layers.Reshape((8, 8))(x)
    )
    gqa = keras.layers.GroupQueryAttention(4, 2, 1, name="gqa")
    h = gqa(h, h)
    h = keras.layers.Reshape((4, 2, 8))(h)
    h = OwnAttention(name="own")(h)
    h = DecidesItself(name="decides")(h)
    # Over two axes its projected query is 5-D: Keras's unfused path.
    h = keras.layers.MultiHeadAttention(2, 4, attention_axes=(1, 2))(h, h)
    return keras.Model(x, keras.layers.Dense(2, name="head")(h))


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_float16_attention_jax_s_cpu_cannot_compile_is_an_error(
    monkeypatch, policy, dropout
):
    kmp.enable(policy)
    model = kmp.pin_float32(_attention_model(dropout))
    monkeypatch.setattr(backend, "list_devices", lambda: [Device("cpu", "x")])
    report = quiet_audit(model)
    found = {f.where: f.severity for f in report if "F16_F16" in f.problem}
    fails = backend.name() == "jax" and policy == "mixed_float16"
    # Keras's attention runs the fused op without dropout only.
    expected = {"gqa", "own"} | ({"mha"} if dropout == 0.0 else set())
    assert found == ({w: "error" for w in expected} if fails else {})
    if fails:  # what the audit says is what JAX does (compiled: eager runs)
        with pytest.raises(Exception, match="F16_F16_F32"):
            model.predict(np.ones((1, 4, 2, 8), "float32"), verbose=0)
    monkeypatch.setattr(
        backend, "list_devices", lambda: [Device("gpu", "H100", (9, 0))]
    )
    assert not any("F16_F16_F32" in f.problem for f in quiet_audit(model))


def test_xla_is_not_mentioned_for_a_float32_model():
    model = compiled_for_audit(
        small_mlp(policy="float32"), optimizer="adam", loss="mse"
    )
    model.compile(optimizer="adam", loss="mse", jit_compile=False)
    assert not has(quiet_audit(model), "XLA")


@tf_only
def test_active_distribution_strategy_is_reported():
    import tensorflow as tf

    kmp.enable("mixed_float16")
    model = compiled_for_audit(kmp.pin_float32(small_mlp()))
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        assert has(quiet_audit(model), "MirroredStrategy", "info")
    assert not has(quiet_audit(model), "distribution is active")


@jax_only
def test_an_active_keras_distribution_is_reported_with_its_mesh():
    import keras

    kmp.enable("mixed_float16")
    model = compiled_for_audit(kmp.pin_float32(small_mlp()))
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    try:
        report = quiet_audit(model)
    finally:
        keras.distribution.set_distribution(None)
    (finding,) = [f for f in report if "distribution is active" in f.problem]
    devices = len(keras.distribution.list_devices())
    assert finding.problem == (
        f"A distribution is active: DataParallel on a mesh of shape "
        f"({devices},), axes ['batch']; each global batch is split over "
        f"{devices} device(s)."
    )
    assert f"multiple of {devices}" in finding.fix
    assert not has(quiet_audit(model), "distribution is active")


@tf_only
def test_a_model_keras_will_not_compile_is_not_told_to_compile():
    # keras-io's text classifier from scratch, end to end: Keras compiles
    # no step of a model with a TextVectorization (it warns so at
    # compile), so the audit's "jit_compile=True" fix did nothing.
    kmp.enable("mixed_float16")
    vectorize = keras.layers.TextVectorization(max_tokens=20)
    vectorize.adapt(["a b c", "d e"])
    inputs = keras.Input((1,), dtype="string")
    x = keras.layers.Embedding(20, 8)(vectorize(inputs))
    outputs = keras.layers.Dense(1, dtype="float32")(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=kmp.wrap("adam"), loss="mse")
    report = quiet_audit(model)
    assert has(report, "environment|The step is not compiled", "info")
    assert "a TextVectorization" in next(
        f.problem for f in report if "not compiled" in f.problem
    )
    assert not has(report, "jit_compile=True")
