"""The audit's model checks (`kmp.auditing.model_checks`), through
`kmp.audit`: each hazard is reported with its layer path and fix, and the
fixed model is not."""

import keras
import numpy as np
import pytest
from audit_util import compiled_for_audit
from audit_util import has
from audit_util import quiet_audit
from audit_util import small_mlp

import kmp
from kmp import backend
from kmp.backend import Device


def test_float16_softmax_output_is_an_error_until_pinned():
    kmp.enable("mixed_float16")
    model = compiled_for_audit(small_mlp())
    assert has(quiet_audit(model), "Model output is a float16 softmax", "error")
    kmp.pin_float32(model)
    assert not has(quiet_audit(model), "Model output")


def test_non_float32_output_is_a_warning():
    kmp.enable("mixed_float16")
    assert has(
        quiet_audit(compiled_for_audit(small_mlp(activation="relu"))),
        "not float32",
        "warning",
    )
    fixed = compiled_for_audit(small_mlp(activation="relu", out="float32"))
    assert not has(quiet_audit(fixed), "Model output")


def test_output_from_a_bare_op_is_a_warning():
    kmp.enable("mixed_float16")
    inputs = keras.Input((16,))
    outputs = keras.ops.softmax(keras.layers.Dense(8)(inputs))
    model = kmp.pin_float32(keras.Model(inputs, outputs))
    assert has(quiet_audit(model), "comes from the op", "warning")
    fixed = keras.Model(
        inputs,
        keras.layers.Activation("softmax")(keras.layers.Dense(8)(inputs)),
    )
    assert not has(quiet_audit(kmp.pin_float32(fixed)), "comes from the op")


def on_a_gpu(monkeypatch):
    """Has the audit see a GPU, where a float16 attention compiles (on
    JAX's CPU it adds an error: `environment_checks_test`)."""
    monkeypatch.setattr(
        backend, "list_devices", lambda: [Device("gpu", "H100", (9, 0))]
    )


def test_inner_softmax_and_attention_in_float16_are_warnings(monkeypatch):
    on_a_gpu(monkeypatch)
    kmp.enable("mixed_float16")
    inputs = keras.Input((8, 16))
    h = keras.layers.MultiHeadAttention(2, 8, name="mha")(inputs, inputs)
    h = keras.layers.Softmax(name="inner")(h)
    h = keras.layers.GlobalAveragePooling1D()(h)
    outputs = keras.layers.Dense(8, dtype="float32")(h)
    model = compiled_for_audit(keras.Model(inputs, outputs), loss="mse")
    report = quiet_audit(model)
    assert has(report, "warning|mha|Attention softmax computes in float16")
    assert has(report, "warning|inner|Softmax computes in float16")
    # Those two and nothing else about the model (whatever the machine
    # adds under "environment": a CPU warns that mixed precision is slow).
    warned = [f.where for f in report if f.severity == "warning"]
    assert sorted(w for w in warned if w != "environment") == ["inner", "mha"]
    kmp.pin_float32(model)
    report = quiet_audit(model)
    assert not has(report, "mha|") and not has(report, "inner|")


def test_inner_fused_softmax_activation_is_a_warning():
    kmp.enable("mixed_float16")
    inputs = keras.Input((16,))
    h = keras.layers.Dense(16, activation="softmax", name="gate")(inputs)
    # A 16-bit reader: one an output of float32 reads is pinned whole
    # (`pin_test.test_probabilities_a_loss_layer_takes_...`).
    h = keras.layers.Dense(16, name="reader")(h)
    outputs = keras.layers.Dense(8, dtype="float32")(h)
    model = compiled_for_audit(
        kmp.pin_float32(keras.Model(inputs, outputs)), loss="mse"
    )
    report = quiet_audit(model)
    assert has(report, "gate|Fused softmax activation computes in float16")
    kmp.pin_float32(model, also=["gate"])
    assert not has(quiet_audit(model), "gate|")


def test_an_inner_fused_sigmoid_is_a_gate_not_a_finding():
    # EfficientNet's squeeze-and-excite: Conv2D(activation="sigmoid")
    # scaling the features. Its float16 values in (0, 1) are fine.
    kmp.enable("mixed_float16")
    inputs = keras.Input((8, 8, 16))
    gate = keras.layers.Conv2D(16, 1, activation="sigmoid", name="se")(inputs)
    h = keras.layers.Multiply()([inputs, gate])
    outputs = keras.layers.Dense(8, dtype="float32")(h)
    model = compiled_for_audit(keras.Model(inputs, outputs), loss="mse")
    assert not has(quiet_audit(model), "se|")


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
    report = quiet_audit(model, optimizer=kmp.wrap("adam"))
    padded = {"units=30": "Use 32.", "filters=20": "Use 24."}
    assert has(report, phrase, "info")
    for key, fix in padded.items():
        if key in phrase:
            assert any(f.fix == fix for f in report)


def test_an_embedding_s_rows_count_only_where_it_makes_logits():
    import keras_hub

    kmp.enable("mixed_float16")
    inputs = keras.Input((8,), dtype="int32")
    positions = keras.layers.Embedding(20, 16)(inputs)  # a lookup only
    tokens = keras_hub.layers.ReversibleEmbedding(1001, 16)
    h = keras.layers.Add()([positions, tokens(inputs)])
    logits = keras.layers.Activation("linear", dtype="float32")(
        tokens(h, reverse=True)
    )
    report = quiet_audit(keras.Model(inputs, logits), optimizer=kmp.wrap("sgd"))
    assert has(report, "input_dim=1001 is not a multiple of 8", "info")
    assert not has(report, "input_dim=20")


def test_transposed_convolution_input_channels_are_read_from_its_kernel():
    kmp.enable("mixed_float16")
    inputs = keras.Input((8, 12))
    h = keras.layers.Conv1DTranspose(16, 3)(inputs)
    model = keras.Model(
        inputs, keras.layers.Activation("linear", dtype="float32")(h)
    )
    report = quiet_audit(model, optimizer=kmp.wrap("adam"))
    assert has(report, "input channels=12", "info")
    assert not has(report, "filters=16")


def test_multi_head_attention_key_dim():
    kmp.enable("mixed_float16")
    inputs = keras.Input((8, 16))
    h = keras.layers.MultiHeadAttention(2, 6)(inputs, inputs)
    model = keras.Model(
        inputs, keras.layers.Activation("linear", dtype="float32")(h)
    )
    report = quiet_audit(model, optimizer=kmp.wrap("adam"))
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
    fused = compiled_for_audit(fused, loss="binary_crossentropy")
    assert has(quiet_audit(fused), "binary_crossentropy on float16", "error")
    kmp.pin_float32(fused)
    assert not has(quiet_audit(fused), "binary_crossentropy on float16")


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
    said = has(quiet_audit(model), "no gradient", "info")
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
    assert not has(quiet_audit(logits), "no gradient")


def test_clean_pinned_model_has_no_warning_naming_a_layer(monkeypatch):
    kmp.enable("mixed_float16")
    inputs = keras.Input((8, 16))
    h = keras.layers.MultiHeadAttention(2, 8, dropout=0.1)(inputs, inputs)
    h = keras.layers.Dense(32, activation="relu")(h)
    h = keras.layers.GlobalAveragePooling1D()(h)
    outputs = keras.layers.Dense(8, activation="softmax")(h)
    model = compiled_for_audit(kmp.pin_float32(keras.Model(inputs, outputs)))
    report = quiet_audit(model)
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
    assert has(quiet_audit(net), "not built with one input", "info")
    net(np.ones((2, 8), "float32"))
    assert has(quiet_audit(net), "model|Subclassed model's output is float16")
    fixed = Net(out_dtype="float32")
    fixed(np.ones((2, 8), "float32"))
    assert not has(quiet_audit(fixed), "Subclassed model")
    # Pinned, its output is cast to float32 (its Softmax layer computes
    # in float32 inside): nothing to say.
    kmp.pin_float32(net)
    assert not has(quiet_audit(net), "Subclassed model")
    assert not has(quiet_audit(net), "inside a subclassed model")


def test_a_pinned_subclassed_model_s_softmax_head_is_reported_once():
    kmp.enable("mixed_float16")

    class Classifier(keras.Model):
        def __init__(self):
            super().__init__()
            self.head = keras.layers.Dense(8, activation="softmax")

        def call(self, x):
            return self.head(x)

    model = kmp.pin_float32(Classifier())
    # Not built: its outputs are cast, its layers made in build wait.
    assert has(quiet_audit(model), "model|Subclassed model, not built", "info")
    out = model(np.ones((2, 4), "float32"))
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    (finding,) = [f for f in quiet_audit(model) if "softmax" in f.problem]
    assert finding.where == model.head.path
    assert finding.problem.startswith(
        "Fused softmax activation computes in float16"
    )
    # Pinning first: split into an Activation, a head's probabilities
    # come out rounded to float16, then cast (helper, keras-io's NER).
    assert finding.fix.startswith(
        f"kmp.pin_float32(model, also=['{finding.where}']), which computes"
    )
    kmp.pin_float32(model, also=[finding.where])
    assert model.head.compute_dtype == "float32"
    assert not has(quiet_audit(model), "softmax")


def test_a_subclassed_attention_s_float16_softmax_is_reported_until_pinned(
    monkeypatch,
):
    on_a_gpu(monkeypatch)

    # KerasHub's CachedMultiHeadAttention is such a subclass.
    class MyAttention(keras.layers.MultiHeadAttention):
        pass

    kmp.enable("mixed_float16")
    inputs = keras.Input((8, 16))
    h = MyAttention(2, 8, name="sub")(inputs, inputs)
    h = keras.layers.GlobalAveragePooling1D()(h)
    model = keras.Model(inputs, keras.layers.Dense(8, dtype="float32")(h))
    report = quiet_audit(model)
    assert has(report, "warning|sub|Attention softmax computes in float16")
    assert has(report, "load it with kmp.load_model, which pins a pinned")
    kmp.pin_float32(model)
    attention = model.get_layer("sub")
    assert type(attention) is MyAttention  # its own code kept
    assert type(attention._softmax) is kmp.layers.Float32Softmax
    assert not has(quiet_audit(model), "sub|")


def test_a_trainer_s_held_models_outputs_are_checked():
    # keras-io's VAE: no call of its own, so no output to build and
    # check ("Call the model on a batch", which it cannot take); its
    # loss reads the decoder's sigmoid, float16 under Keras's policy
    # (its crossentropy inf at every epoch: helper, 2026-11-30).
    keras.config.set_dtype_policy("mixed_float16")

    def coder(activation, name):
        inputs = keras.Input((4,))
        out = keras.layers.Dense(4, activation=activation, name="out")
        return keras.Model(inputs, out(inputs), name=name)

    class Trainer(keras.Model):
        def __init__(self):
            super().__init__()
            self.encoder = coder(None, "encoder")
            self.decoder = coder("sigmoid", "decoder")

        def train_step(self, data):  # keras-io's VAE's loss, short
            reconstruction = self.decoder(self.encoder(data))
            loss = keras.losses.binary_crossentropy(data, reconstruction)
            return {"loss": keras.ops.mean(loss)}

    class NoCrossentropy(Trainer):  # a generator's sigmoid makes images
        def train_step(self, data):
            return {"loss": keras.ops.mean(self.decoder(data))}

    (finding,) = [
        f
        for f in quiet_audit(NoCrossentropy())
        if f.where == "decoder/out" and "sigmoid" in f.problem
    ]
    assert finding.severity == "warning"
    trainer = Trainer()
    report = quiet_audit(trainer)
    (error,) = [f for f in report if f.severity == "error"]
    assert error.where == "decoder/out"
    assert error.problem.startswith("Model output is a float16 sigmoid")
    assert error.fix.startswith("kmp.pin_float32(model)")
    assert has(report, "Model output is float16, not float32", "warning")
    assert not has(report, "Call the model on a batch")
    kmp.enable("mixed_float16")
    kmp.pin_float32(trainer)
    report = quiet_audit(trainer)
    assert not has(report, "Model output")

    # A held Sequential built without an Input: its layers' paths start
    # with its name, said once.
    keras.config.set_dtype_policy("mixed_float16")

    class GAN(keras.Model):
        def __init__(self):
            super().__init__()
            self.generator = keras.Sequential(
                [keras.layers.Dense(4, activation="sigmoid", name="out")],
                name="generator",
            )
            self.generator(np.ones((1, 4), "float32"))

    (found,) = [f for f in quiet_audit(GAN()) if "sigmoid" in f.problem]
    assert found.where == "generator/out"
