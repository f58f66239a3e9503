"""Each of kmp.audit's checks (`kmp._audit_checks`), through `kmp.audit`:
the hazard is reported with its layer path and fix, and the fixed model
is not."""

import keras
import numpy as np
import pytest
from util import tf_only

import kmp
from kmp import backend
from kmp import policy as policy_lib
from kmp.backend import Device


def _phrases(report, severity=None):
    return [
        f"{f.severity}|{f.where}|{f.problem}"
        for f in report
        if severity is None or f.severity == severity
    ]


def _has(report, phrase, severity=None):
    return any(phrase in p for p in _phrases(report, severity))


def _audit(model, **kwargs):
    return kmp.audit(model, verbose=False, **kwargs)


def _mlp(units=16, activation="softmax", policy="mixed_float16", out=None):
    with kmp.policy_scope(policy):
        return keras.Sequential(
            [
                keras.Input((16,)),
                keras.layers.Dense(units, activation="relu"),
                keras.layers.Dense(8),
                keras.layers.Activation(activation, dtype=out),
            ]
        )


def _compiled(model, optimizer="wrap", loss="categorical_crossentropy"):
    if optimizer == "wrap":
        optimizer = kmp.wrap("adam")
    model.compile(
        optimizer=optimizer, loss=loss, jit_compile=True, auto_scale_loss=False
    )
    return model


def test_float16_softmax_output_is_an_error_until_pinned():
    kmp.enable("mixed_float16")
    model = _compiled(_mlp())
    assert _has(_audit(model), "Model output is a float16 softmax", "error")
    kmp.pin_float32(model)
    assert not _has(_audit(model), "Model output")


def test_non_float32_output_is_a_warning():
    kmp.enable("mixed_float16")
    assert _has(
        _audit(_compiled(_mlp(activation="relu"))),
        "not float32",
        "warning",
    )
    fixed = _compiled(_mlp(activation="relu", out="float32"))
    assert not _has(_audit(fixed), "Model output")


def test_output_from_a_bare_op_is_a_warning():
    kmp.enable("mixed_float16")
    inputs = keras.Input((16,))
    outputs = keras.ops.softmax(keras.layers.Dense(8)(inputs))
    model = kmp.pin_float32(keras.Model(inputs, outputs))
    assert _has(_audit(model), "comes from the op", "warning")
    fixed = keras.Model(
        inputs,
        keras.layers.Activation("softmax")(keras.layers.Dense(8)(inputs)),
    )
    assert not _has(_audit(kmp.pin_float32(fixed)), "comes from the op")


def test_inner_softmax_and_attention_in_float16_are_warnings():
    kmp.enable("mixed_float16")
    inputs = keras.Input((8, 16))
    h = keras.layers.MultiHeadAttention(2, 8, name="mha")(inputs, inputs)
    h = keras.layers.Softmax(name="inner")(h)
    h = keras.layers.GlobalAveragePooling1D()(h)
    outputs = keras.layers.Dense(8, dtype="float32")(h)
    model = _compiled(keras.Model(inputs, outputs), loss="mse")
    report = _audit(model)
    assert _has(report, "warning|mha|Attention softmax computes in float16")
    assert _has(report, "warning|inner|Softmax computes in float16")
    assert len(_phrases(report, "warning")) == 2 + 1  # + environment (CPU)
    kmp.pin_float32(model)
    report = _audit(model)
    assert not _has(report, "mha|") and not _has(report, "inner|")


def test_inner_fused_softmax_activation_is_a_warning():
    kmp.enable("mixed_float16")
    inputs = keras.Input((16,))
    h = keras.layers.Dense(16, activation="softmax", name="gate")(inputs)
    outputs = keras.layers.Dense(8, dtype="float32")(h)
    model = _compiled(kmp.pin_float32(keras.Model(inputs, outputs)), loss="mse")
    report = _audit(model)
    assert _has(report, "gate|Fused softmax activation computes in float16")
    kmp.pin_float32(model, also=["gate"])
    assert not _has(_audit(model), "gate|")


def test_float16_without_loss_scaling_is_an_error():
    kmp.enable("mixed_float16")
    model = _compiled(_mlp(out="float32"), optimizer="adam")
    assert _has(_audit(model), "does not scale the loss", "error")
    assert not _has(_audit(_compiled(_mlp(out="float32"))), "scale the loss")


def test_per_layer_float16_under_a_float32_policy_is_caught():
    kmp.enable("float32")
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(16, dtype="mixed_float16", name="half"),
            keras.layers.Dense(8),
        ]
    )
    model.compile(optimizer="adam", loss="mse")  # Keras wraps nothing
    assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert _has(_audit(model), "half'", "error")


def test_stock_scaler_is_a_warning():
    kmp.enable("mixed_float16")
    stock = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    model = _compiled(_mlp(out="float32"), optimizer=stock)
    assert _has(_audit(model), "stock keras LossScaleOptimizer", "warning")
    assert not _has(_audit(_compiled(_mlp(out="float32"))), "stock keras")


def test_needless_scaler_under_bfloat16_is_reported():
    kmp.enable("mixed_bfloat16")
    model = _mlp(out="float32", policy="mixed_bfloat16")
    scaler = kmp.LossScaleOptimizer(keras.optimizers.Adam())
    assert _has(_audit(model, optimizer=scaler), "no layer computes in float16")
    assert not _has(_audit(_compiled(model)), "no layer computes in float16")


@pytest.mark.parametrize(
    "make, phrase",
    [
        (lambda: keras.layers.Dense(30), "units=30 is not a multiple of 8"),
        (lambda: keras.layers.Conv1D(20, 3), "filters=20"),
        (lambda: keras.layers.Embedding(1000, 100), "output_dim=100"),
    ],
)
def test_sizes_that_miss_tensor_cores_get_the_padded_size(make, phrase):
    kmp.enable("mixed_float16")
    inputs = keras.Input(
        (8, 16), dtype="int32" if "output_dim" in phrase else None
    )
    h = make()(inputs)
    model = keras.Model(
        inputs, keras.layers.Activation("linear", dtype="float32")(h)
    )
    report = _audit(model, optimizer=kmp.wrap("adam"))
    padded = {"units=30": "Use 32.", "filters=20": "Use 24."}
    assert _has(report, phrase, "info")
    for key, fix in padded.items():
        if key in phrase:
            assert any(f.fix == fix for f in report)


def test_transposed_convolution_input_channels_are_read_from_its_kernel():
    kmp.enable("mixed_float16")
    inputs = keras.Input((8, 12))
    h = keras.layers.Conv1DTranspose(16, 3)(inputs)
    model = keras.Model(
        inputs, keras.layers.Activation("linear", dtype="float32")(h)
    )
    report = _audit(model, optimizer=kmp.wrap("adam"))
    assert _has(report, "input channels=12", "info")
    assert not _has(report, "filters=16")


def test_multi_head_attention_key_dim():
    kmp.enable("mixed_float16")
    inputs = keras.Input((8, 16))
    h = keras.layers.MultiHeadAttention(2, 6)(inputs, inputs)
    model = keras.Model(
        inputs, keras.layers.Activation("linear", dtype="float32")(h)
    )
    report = _audit(model, optimizer=kmp.wrap("adam"))
    assert any(
        f.problem.startswith("key_dim=6") and f.fix == "Use 8." for f in report
    )


def test_binary_crossentropy_on_float16_sigmoid_is_an_error():
    kmp.enable("mixed_float16")
    # A Dense with a fused sigmoid as output:
    with kmp.policy_scope("mixed_float16"):
        fused = keras.Sequential(
            [keras.Input((16,)), keras.layers.Dense(1, activation="sigmoid")]
        )
    fused = _compiled(fused, loss="binary_crossentropy")
    assert _has(_audit(fused), "binary_crossentropy on float16", "error")
    kmp.pin_float32(fused)
    assert not _has(_audit(fused), "binary_crossentropy on float16")


def test_crossentropy_without_a_logits_path_is_said_with_its_fix():
    # On JAX and torch, Keras's crossentropy of probabilities clips them
    # at 1e-7: logits [0, -30] give 16.1 (TensorFlow: 30) and the
    # gradient by the logits is zero, even in float32.
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((1,)),
            keras.layers.Dense(2),
            keras.layers.Activation("softmax", dtype="float32"),
        ]
    )
    model.layers[0].set_weights(
        [np.zeros((1, 2), "float32"), np.array([0.0, -30.0], "float32")]
    )
    loss = keras.losses.SparseCategoricalCrossentropy()
    value = float(loss(np.array([1]), model(np.ones((1, 1), "float32"))))
    model.compile(optimizer="sgd", loss=loss)
    said = _has(_audit(model), "no gradient", "info")
    if backend.crossentropy_reads_logits():
        assert value == pytest.approx(30.0) and not said
        return
    assert value == pytest.approx(16.118, abs=1e-3) and said
    # The fix it names: logits out, from_logits=True.
    logits = keras.Sequential([keras.Input((1,)), model.layers[0]])
    model_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    value = float(model_loss(np.array([1]), logits(np.ones((1, 1)))))
    assert value == pytest.approx(30.0)
    logits.compile(optimizer="sgd", loss=model_loss)
    assert not _has(_audit(logits), "no gradient")


def test_environment_findings(monkeypatch):
    kmp.enable("mixed_float16")
    model = _compiled(kmp.pin_float32(_mlp()))
    monkeypatch.setattr(policy_lib, "_logged_reasons", set())
    monkeypatch.setattr(backend, "list_devices", lambda: [Device("cpu", "x")])
    report = _audit(model)
    assert _has(report, "environment|Mixed precision on hardware", "warning")
    assert _has(report, f"{backend.step_compiler()} is on", "info")
    # A CPU has no TF32, whatever TensorFlow's setting says.
    assert not _has(report, "TF32")
    monkeypatch.setattr(
        backend, "list_devices", lambda: [Device("gpu", "A100", (8, 0))]
    )
    assert not _has(_audit(model), "Mixed precision on hardware")
    assert _has(_audit(model), "TF32 for float32 matmuls", "info")
    monkeypatch.setattr(
        backend, "list_devices", lambda: [Device("gpu", "T4", (7, 5))]
    )
    assert not _has(_audit(model), "TF32")
    model.compile(optimizer=kmp.wrap("adam"), loss="mse", jit_compile=False)
    if backend.name() == "torch":
        assert _has(_audit(model), "runs eagerly (jit_compile=False", "info")
    else:
        assert _has(_audit(model), "without XLA", "warning")


def test_xla_is_not_mentioned_for_a_float32_model():
    model = _compiled(_mlp(policy="float32"), optimizer="adam", loss="mse")
    model.compile(optimizer="adam", loss="mse", jit_compile=False)
    assert not _has(_audit(model), "XLA")


def test_a_scaler_keras_added_at_compile_time_is_a_saving_hazard():
    kmp.enable("mixed_float16")

    def compiled(optimizer):
        model = kmp.pin_float32(_mlp())
        model.compile(optimizer=optimizer, loss="categorical_crossentropy")
        return model

    model = compiled("sgd")  # Keras wraps it in its own scaler
    assert type(model.optimizer) is keras.optimizers.LossScaleOptimizer
    assert _has(
        _audit(model), "model|Keras wrapped the compiled SGD", "warning"
    )
    given = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    assert not _has(_audit(compiled(given)), "Keras wrapped")
    assert not _has(_audit(compiled(kmp.wrap("sgd"))), "Keras wrapped")


@tf_only
def test_active_distribution_strategy_is_reported():
    import tensorflow as tf

    kmp.enable("mixed_float16")
    model = _compiled(kmp.pin_float32(_mlp()))
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        assert _has(_audit(model), "MirroredStrategy", "info")
    assert not _has(_audit(model), "distribution is active")


def test_clean_pinned_model_has_no_warning_naming_a_layer(monkeypatch):
    kmp.enable("mixed_float16")
    inputs = keras.Input((8, 16))
    h = keras.layers.MultiHeadAttention(2, 8, dropout=0.1)(inputs, inputs)
    h = keras.layers.Dense(32, activation="relu")(h)
    h = keras.layers.GlobalAveragePooling1D()(h)
    outputs = keras.layers.Dense(8, activation="softmax")(h)
    model = _compiled(kmp.pin_float32(keras.Model(inputs, outputs)))
    report = _audit(model)
    named = [
        f
        for f in report
        if f.severity in ("error", "warning")
        and f.where not in ("model", "environment")
    ]
    assert named == []


def test_subclassed_model_output_dtype_is_checked_once_built():
    kmp.enable("mixed_float16")

    class Net(keras.Model):
        def __init__(self, out_dtype=None):
            super().__init__()
            self.dense = keras.layers.Dense(8)
            self.softmax = keras.layers.Softmax(dtype=out_dtype)

        def call(self, x):
            return self.softmax(self.dense(x))

    net = Net()
    assert _has(_audit(net), "not built with one input", "info")
    net(np.ones((2, 8), "float32"))
    assert _has(_audit(net), "model|Subclassed model's output is float16")
    fixed = Net(out_dtype="float32")
    fixed(np.ones((2, 8), "float32"))
    assert not _has(_audit(fixed), "Subclassed model")
