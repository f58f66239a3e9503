from unittest import mock

import keras
import numpy as np
import pytest
from keras import ops
from util import JIT_COMPILE
from util import classification_data
from util import probability_model

import kmp
from kmp import backend


def _dtype(x):
    return keras.backend.standardize_dtype(x.dtype)


def test_output_softmax_crossentropy_equals_the_float32_models():
    x, y = np.ones((1, 1), "float32"), np.array([1])
    loss = keras.losses.SparseCategoricalCrossentropy()
    reference = float(loss(y, probability_model("float32")(x)))
    mixed = probability_model("mixed_float16")
    kmp.enable("mixed_float16")
    pinned = kmp.pin_float32(mixed)
    assert pinned is mixed
    assert _dtype(pinned(x)) == "float32"
    assert float(loss(y, pinned(x))) == pytest.approx(reference, rel=1e-6)
    if backend.name() == "tensorflow":
        # Keras's logits path survives: the true crossentropy, not the
        # 16.1 that clipped float16 probabilities give. (JAX arrays cannot
        # carry that path; there the float32 model also gives 16.1.)
        assert reference == pytest.approx(30.0)


def test_a_hidden_sigmoid_a_head_reads_keeps_its_16_bits():
    # Probabilities an output's matmul reads as features are no loss's
    # input: the hidden layer's matmul stays in 16 bits (a review caught
    # a first version that pinned it, and its matmul ran in float32).
    kmp.enable("mixed_float16")
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="sigmoid", name="hidden")
    head = keras.layers.Dense(2, activation="softmax", name="head")
    kmp.pin_float32(keras.Model(inputs, head(hidden(inputs))))
    assert hidden.compute_dtype == "float16"
    assert head.compute_dtype == "float32"


def test_a_pinned_softmax_output_trains_where_float16_s_steps_skip():
    # `stock_keras_test.test_float16_output_softmax_stalls_...`: kmp's
    # scaler skips them too, unpinned; pinned, the gradient reaches the
    # logits as p - y, and every step applies.
    from stock_keras_test import unlikely_class_model

    x, y = np.ones((8, 1), "float32"), np.ones((8,), "int32")
    kmp.enable("mixed_float16")
    for pin, skipped in ((False, 5), (True, 0)):
        model = unlikely_class_model("mixed_float16")
        if pin:
            kmp.pin_float32(model)
        optimizer = kmp.wrap(keras.optimizers.SGD(0.1))
        model.compile(
            optimizer=optimizer, loss="sparse_categorical_crossentropy"
        )
        model.fit(x, y, batch_size=8, epochs=5, verbose=0)
        assert int(optimizer.skipped_steps) == skipped


def _functional():
    inputs = keras.Input((6, 16))
    h = keras.layers.MultiHeadAttention(2, 8, dropout=0.1, name="mha")(
        inputs, inputs
    )
    h = keras.layers.Activation("softmax", name="inner_softmax")(h)
    h = keras.layers.Activation("relu", name="relu")(h)
    h = keras.layers.LayerNormalization(name="norm")(h)
    h = keras.layers.GlobalAveragePooling1D()(h)
    outputs = keras.layers.Dense(3, activation="softmax", name="head")(h)
    return keras.Model(inputs, outputs)


def test_functional_model_is_pinned_where_it_matters_only():
    kmp.enable("mixed_float16")
    model = kmp.pin_float32(_functional())
    kinds = {layer.name: type(layer) for layer in model.layers}
    policies = {layer.name: layer.dtype_policy.name for layer in model.layers}
    assert kinds["mha"] is kmp.layers.MultiHeadAttention
    assert kinds["inner_softmax"] is kmp.layers.Float32Activation
    assert kinds["relu"] is keras.layers.Activation  # not sensitive
    assert kinds["norm"] is keras.layers.LayerNormalization  # already fp32
    assert policies["head"] == "float32"
    assert policies["mha"] == policies["relu"] == "mixed_float16"
    assert all(w.dtype == "float32" for w in model.weights)
    x = np.zeros((2, 6, 16), "float32")
    assert _dtype(model(x)) == "float32"
    assert _dtype(model.get_layer("inner_softmax")(x[:, :, :16])) == "float16"


def test_unbuilt_sequential_output_is_float32_once_built():
    kmp.enable("mixed_float16")
    model = keras.Sequential(
        [
            keras.layers.Dense(4),
            keras.layers.Softmax(),
            keras.layers.Dense(4),
            keras.layers.Dense(2),
        ]
    )
    kmp.pin_float32(model)
    assert type(model.layers[1]) is kmp.layers.Float32Softmax
    assert model.layers[-1].dtype_policy.name == "float32"
    assert _dtype(model(np.ones((1, 3), "float32"))) == "float32"


def test_nested_models_and_layers_are_opened():
    kmp.enable("mixed_float16")

    class Block(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense = keras.layers.Dense(4)
            self.softmax = keras.layers.Softmax()

        def call(self, x):
            return self.softmax(self.dense(x))

    inner_in = keras.Input((4,))
    inner = keras.Model(
        inner_in, keras.layers.Dense(2, activation="sigmoid")(inner_in)
    )
    outer_in = keras.Input((3,))
    block = Block()
    model = keras.Model(outer_in, inner(block(outer_in)))
    kmp.pin_float32(model)
    assert type(block.softmax) is kmp.layers.Float32Softmax
    assert inner.layers[-1].dtype_policy.name == "float32"
    assert _dtype(model(np.ones((2, 3), "float32"))) == "float32"


def test_subclassed_model_gets_its_inner_softmaxes_pinned():
    kmp.enable("mixed_float16")

    class Classifier(keras.Model):
        def __init__(self):
            super().__init__()
            self.attention = keras.layers.MultiHeadAttention(2, 4)
            self.pool = keras.layers.GlobalAveragePooling1D()
            self.head = keras.layers.Dense(2, dtype="float32")

        def call(self, x):
            return self.head(self.pool(self.attention(x, x)))

    model = Classifier()
    kmp.pin_float32(model)
    assert type(model.attention) is kmp.layers.MultiHeadAttention
    assert _dtype(model(np.ones((2, 3, 4), "float32"))) == "float32"


def test_pinning_keeps_trained_weights_and_is_idempotent():
    kmp.enable("mixed_float16")
    model = _functional()
    x = np.random.default_rng(0).normal(size=(8, 6, 16)).astype("float32")
    before = [w.numpy().copy() for w in model.weights]
    kmp.pin_float32(model)
    for a, b in zip(before, model.weights):
        np.testing.assert_array_equal(a, b.numpy())
    config = model.get_config()
    outputs = ops.convert_to_numpy(model(x))
    kmp.pin_float32(model)
    assert model.get_config() == config
    np.testing.assert_array_equal(ops.convert_to_numpy(model(x)), outputs)


def test_float32_model_is_left_alone():
    kmp.enable("float32")
    model = _functional()
    config = model.get_config()
    assert kmp.pin_float32(model) is model
    assert model.get_config() == config
    assert type(model.get_layer("mha")) is keras.layers.MultiHeadAttention


def test_pinned_model_survives_keras_save_and_load(tmp_path):
    kmp.enable("mixed_float16")
    model = kmp.pin_float32(_functional())
    x = np.random.default_rng(1).normal(size=(2, 6, 16)).astype("float32")
    path = str(tmp_path / "pinned.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)  # no custom_objects
    assert type(loaded.get_layer("mha")) is kmp.layers.MultiHeadAttention
    assert type(loaded.get_layer("inner_softmax")) is (
        kmp.layers.Float32Activation
    )
    assert loaded.get_layer("head").dtype_policy.name == "float32"
    np.testing.assert_array_equal(
        ops.convert_to_numpy(loaded(x)), ops.convert_to_numpy(model(x))
    )
    loaded(x, training=False)
    assert type(loaded.get_layer("mha")._softmax) is kmp.layers.Float32Softmax


@pytest.mark.parametrize("jit_compile", JIT_COMPILE)
def test_pinned_model_trains_with_kmp_scaler(jit_compile):
    kmp.enable("mixed_float16")
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu")(inputs)
    h = keras.layers.Softmax()(h)
    outputs = keras.layers.Dense(2, activation="softmax")(
        keras.layers.Dense(16, activation="relu")(h)
    )
    model = kmp.pin_float32(keras.Model(inputs, outputs))
    model.compile(
        optimizer=kmp.wrap(keras.optimizers.Adam(1e-2)),
        loss="sparse_categorical_crossentropy",
        jit_compile=jit_compile,
    )
    x, y = classification_data()
    history = model.fit(x, y, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_also_pins_layers_by_pattern_or_class():
    kmp.enable("mixed_float16")
    model = kmp.pin_float32(
        _functional(), also=[r"re.*", keras.layers.GlobalAveragePooling1D]
    )
    assert model.get_layer("relu").dtype_policy.name == "float32"
    pooling = [
        layer
        for layer in model.layers
        if isinstance(layer, keras.layers.GlobalAveragePooling1D)
    ]
    assert pooling[0].dtype_policy.name == "float32"
    assert model.get_layer("mha").dtype_policy.name == "mixed_float16"


@pytest.mark.parametrize(
    "also, phrase",
    [([3], "takes layer classes"), (["("], "not a valid regular expression")],
)
def test_bad_arguments(also, phrase):
    kmp.enable("mixed_float16")
    with pytest.raises(ValueError, match=phrase):
        kmp.pin_float32(_functional(), also=also)
    with pytest.raises(ValueError, match="expects a Keras model"):
        kmp.pin_float32("model")


def _transformer_block(dropout):
    inputs = keras.Input((8, 16))
    attention = keras.layers.MultiHeadAttention(
        2, 8, dropout=dropout, name="attention"
    )
    h = keras.layers.LayerNormalization()(inputs + attention(inputs, inputs))
    f = keras.layers.Dense(32, activation="relu", name="ffn_in")(h)
    h = keras.layers.LayerNormalization()(
        h + keras.layers.Dense(16, name="ffn_out")(f)
    )
    h = keras.layers.GlobalAveragePooling1D()(h)
    outputs = keras.layers.Dense(2, activation="softmax", name="head")(h)
    return keras.Model(inputs, outputs)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_transformer_block_softmax_in_float32_matmuls_in_float16(dropout):
    kmp.enable("mixed_float16")
    model = kmp.pin_float32(_transformer_block(dropout))
    seen = {"softmax": [], "einsum": [], "dense": []}
    originals = {
        "softmax": keras.layers.Softmax.call,
        "einsum": keras.layers.EinsumDense.call,
        "dense": keras.layers.Dense.call,
    }

    def spy(kind):
        def call(self, inputs, *args, **kwargs):
            seen[kind].append((self.name, _dtype(inputs)))
            return originals[kind](self, inputs, *args, **kwargs)

        return call

    x = np.random.default_rng(0).normal(size=(2, 8, 16)).astype("float32")
    with (
        mock.patch.object(keras.layers.Softmax, "call", spy("softmax")),
        mock.patch.object(keras.layers.EinsumDense, "call", spy("einsum")),
        mock.patch.object(keras.layers.Dense, "call", spy("dense")),
    ):
        y = model(x, training=True)
    assert _dtype(y) == "float32"
    # Query/key/value/output projections and the FFN run in float16...
    assert {d for _, d in seen["einsum"]} == {"float16"}
    assert dict(seen["dense"]) == {
        "ffn_in": "float16",
        "ffn_out": "float16",
        "head": "float32",
    }
    # ...and the attention softmax, where Keras's unfused path runs it
    # (dropout > 0), gets float32 scores. Without dropout Keras uses its
    # fused dot_product_attention, which computes softmax in float32 itself.
    assert [d for _, d in seen["softmax"]] == (["float32"] if dropout else [])


LAYER_KINDS = {
    "softmax_layer": (lambda: keras.layers.Softmax(), "float16"),
    "activation_softmax": (
        lambda: keras.layers.Activation("softmax"),
        "float16",
    ),
    "activation_sigmoid": (
        lambda: keras.layers.Activation("sigmoid"),
        "float16",
    ),
    "activation_log_softmax": (
        lambda: keras.layers.Activation("log_softmax"),
        "float16",
    ),
    "activation_relu": (lambda: keras.layers.Activation("relu"), "float16"),
    "dense_softmax": (
        lambda: keras.layers.Dense(8, activation="softmax"),
        "float16",
    ),
    "layer_norm": (lambda: keras.layers.LayerNormalization(), "float16"),
}


@pytest.mark.parametrize("kind", sorted(LAYER_KINDS))
@pytest.mark.parametrize("position", ["inner", "output"])
def test_precision_of_every_layer_kind_kmp_touches(kind, position):
    """In the spirit of Keras's run_mixed_precision_check: a pinned layer's
    output is its compute dtype inside the model and float32 at the
    output; its float weights stay float32."""
    kmp.enable("mixed_float16")
    make, inner_dtype = LAYER_KINDS[kind]
    layer = make()
    inputs = keras.Input((8,))
    h = keras.layers.Dense(8)(inputs)
    h = layer(h)
    if position == "inner":
        # Read by a 16-bit layer (one that an output of float32 reads
        # computes in float32 whole: `test_probabilities_a_loss_layer_...`).
        h = keras.layers.Dense(8, name="reader")(h)
        h = keras.layers.Dense(8, dtype="float32", name="output")(h)
    model = kmp.pin_float32(keras.Model(inputs, h))
    x = np.ones((2, 8), "float32")
    if position == "inner":
        probe = keras.Model(inputs, model.get_layer(layer.name).output)
        assert _dtype(probe(x)) == inner_dtype
    else:
        assert layer.dtype_policy.name == "float32"
        assert _dtype(model(x)) == "float32"
    for weight in model.weights:
        assert weight.dtype == "float32"


def test_kerashub_gpt2_is_pinned_in_memory_and_a_lost_pin_is_reported(
    tmp_path,
):
    # A model kmp did not write: KerasHub's GPT-2 from a small config (no
    # preset). Its attention is CachedMultiHeadAttention, a subclass made
    # inside TransformerDecoder: pinned in memory, rebuilt unpinned by a
    # .keras load, and the audit says so instead of staying silent.
    from util import small_gpt2_backbone

    kmp.enable("mixed_float16")
    backbone = small_gpt2_backbone()

    def unpinned(model):
        report = kmp.audit(model, verbose=False)
        return sorted(
            f.where for f in report if "Attention softmax" in f.problem
        )

    decoders = [f"transformer_layer_{i}/self_attention" for i in range(2)]
    assert unpinned(backbone) == decoders
    kmp.pin_float32(backbone)
    assert unpinned(backbone) == []
    attention = backbone.get_layer("transformer_layer_0")._self_attention_layer
    assert type(attention).__name__ == "CachedMultiHeadAttention"
    assert type(attention._softmax) is kmp.layers.Float32Softmax

    path = str(tmp_path / "gpt2.keras")
    backbone.save(path)
    assert unpinned(keras.saving.load_model(path)) == decoders


class Trainer(keras.Model):
    """keras-io's VAE's shape: models held, no `call` of its own (its
    train step reads the decoder's output)."""

    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder


def _coder(units, activation=None, name=None):
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, name=f"{name}_hidden")(inputs)
    out = keras.layers.Dense(units, activation=activation, name=f"{name}_out")
    return keras.Model(inputs, out(hidden), name=name)


def test_a_trainer_s_held_models_get_their_outputs_pinned():
    kmp.enable("mixed_float16")
    trainer = Trainer(_coder(4, name="enc"), _coder(4, "sigmoid", "dec"))
    assert kmp.pin_float32(trainer) is trainer
    for coder in ("enc", "dec"):
        model = getattr(trainer, f"{coder}oder")
        assert model.get_layer(f"{coder}_out").compute_dtype == "float32"
        assert model.get_layer(f"{coder}_hidden").compute_dtype == "float16"
    x = np.zeros((2, 4), "float32")
    out = trainer.decoder(trainer.encoder(x))
    assert keras.backend.standardize_dtype(out.dtype) == "float32"

    # A model with a call of its own returns what it computes: the
    # models it holds are its layers, their outputs its inner tensors.
    class Calls(Trainer):
        def call(self, x):
            return self.decoder(self.encoder(x))

    calls = Calls(_coder(4, name="enc"), _coder(4, "sigmoid", "dec"))
    kmp.pin_float32(calls)
    assert calls.encoder.get_layer("enc_out").compute_dtype == "float16"


class NegativeLogLikelihood(keras.layers.Layer):
    """keras-io's captcha OCR's habit: a loss layer at the output that
    adds the loss of the probabilities it takes and passes them on."""

    def call(self, labels, probabilities):
        log = ops.log(probabilities + 1e-12)
        self.add_loss(-ops.mean(ops.sum(labels * log, axis=-1)))
        return probabilities


def _loss_layer_model(policy, activation):
    """Logits [0, 25] into a softmax (fused or a layer of its own), whose
    probabilities a loss layer takes: class 0's, 1.4e-11, is 0 in
    float16."""
    with kmp.policy_scope(policy):
        x = keras.Input((1,))
        labels = keras.Input((2,))
        fused = "softmax" if activation == "fused" else None
        dense = keras.layers.Dense(2, activation=fused, name="logits")
        probabilities = dense(x)
        if activation != "fused":
            probabilities = keras.layers.Activation("softmax", name="probs")(
                probabilities
            )
        out = NegativeLogLikelihood(name="loss")(labels, probabilities)
        model = keras.Model([x, labels], out)
    dense.set_weights([np.zeros((1, 2)), np.array([0.0, 25.0])])
    return model


@pytest.mark.parametrize("activation", ["fused", "layer"])
def test_probabilities_a_loss_layer_takes_are_computed_in_float32(
    activation,
):
    x, labels = np.ones((1, 1), "float32"), np.array([[1.0, 0.0]], "float32")
    reference = _loss_layer_model("float32", activation)
    expected = ops.convert_to_numpy(reference([x, labels]))
    kmp.enable("mixed_float16")
    model = kmp.pin_float32(_loss_layer_model("mixed_float16", activation))
    probabilities = model.layers[-2]  # the fused Dense, or the Activation
    assert probabilities.compute_dtype == "float32"
    assert type(probabilities) in (keras.layers.Dense, keras.layers.Activation)
    got = model([x, labels])
    assert _dtype(got) == "float32"
    # Class 0's probability, 0 in float16 (its loss then log(1e-12)).
    np.testing.assert_allclose(ops.convert_to_numpy(got), expected, rtol=1e-5)
    assert expected[0, 0] > 0
    if activation == "fused":  # the logits' matmul too: a head is small
        assert model.get_layer("logits").compute_dtype == "float32"
    else:
        assert model.get_layer("logits").compute_dtype == "float16"


class MakesItsLayersInBuild(keras.Model):
    """keras-io's Perceiver's habit: layers made in `build`."""

    def build(self, input_shape):
        self.attention = keras.layers.MultiHeadAttention(2, 4, dropout=0.1)
        self.pool = keras.layers.GlobalAveragePooling1D()
        self.head = keras.layers.Dense(8)
        super().build(input_shape)

    def call(self, x):
        return self.head(self.pool(self.attention(x, x)))


def test_an_unbuilt_subclassed_model_is_pinned_once_built():
    # Pinned before its build, it had nothing to pin, and said nothing:
    # its attention softmax and logits float16, and TensorFlow's top-k
    # metric refused them in fit (helper, keras-io's Perceiver).
    kmp.enable("mixed_float16")
    model = kmp.pin_float32(MakesItsLayersInBuild())
    assert kmp.pin_float32(model) is model  # no second wrapper
    x = np.random.default_rng(0).normal(size=(16, 3, 4)).astype("float32")
    assert _dtype(model(x)) == "float32"  # the cast, and the build
    assert isinstance(model.attention._softmax, kmp.layers.Float32Softmax)
    assert model.attention.compute_dtype == "float16"
    model.compile(
        optimizer=kmp.wrap("sgd"),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseTopKCategoricalAccuracy(5)],
    )
    logs = model.fit(x, np.arange(16) % 8, verbose=0).history
    assert np.isfinite(logs["loss"][-1])


class Block(keras.layers.Layer):
    """A layer of the user's that makes its attention in its own build,
    which runs inside its model's first call (the review's case)."""

    def build(self, shape):
        self.attention = keras.layers.MultiHeadAttention(2, 4)
        self.attention.build(shape, shape)

    def call(self, x):
        return self.attention(x, x)


class HoldsABlock(keras.Model):
    def build(self, shape):
        if getattr(self, "fail_once", False):
            self.fail_once = False
            raise ValueError("a first build that fails")
        self.block = Block()
        self.head = keras.layers.Dense(8)

    def call(self, x):
        return self.head(keras.ops.mean(self.block(x), axis=1))


def test_layers_a_layer_makes_in_its_own_build_are_pinned_too():
    kmp.enable("mixed_float16")
    model = HoldsABlock()
    model.fail_once = True
    kmp.pin_float32(model)
    x = np.ones((2, 3, 4), "float32")
    with pytest.raises(ValueError, match="a first build that fails"):
        model.build(x.shape)
    model(x)  # built now: the wrapper stayed for it
    assert isinstance(model.block.attention._softmax, kmp.layers.Float32Softmax)
    assert _dtype(model(x)) == "float32"


def test_a_model_that_ran_before_pinning_runs_pinned_after():
    # Keras traces `predict`, `evaluate` and `fit` once and reuses the
    # program: on JAX and TensorFlow a model pinned after it ran went on
    # returning float16 from `predict` (2026-12-01).
    kmp.enable("mixed_float16")
    model = _softmax_head()
    model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
    x = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    assert model.predict(x, verbose=0).dtype == np.float16
    model.evaluate(x, x[:, :4], verbose=0)
    kmp.pin_float32(model)
    predicted = model.predict(x, verbose=0)
    assert predicted.dtype == np.float32
    np.testing.assert_array_equal(predicted, ops.convert_to_numpy(model(x)))
    reference = model.evaluate(x, x[:, :4], verbose=0, batch_size=32)
    called = float(
        ops.mean(keras.losses.mean_squared_error(x[:, :4], model(x)))
    )
    assert reference == pytest.approx(called, rel=1e-6)


def test_a_model_pinned_as_its_first_predict_builds_it_predicts_on():
    # Pinned inside the trace that builds it: that trace is kept, and
    # the batches after the first run it.
    kmp.enable("mixed_float16")
    model = kmp.pin_float32(MakesItsLayersInBuild())
    x = np.random.default_rng(0).normal(size=(48, 3, 4)).astype("float32")
    predicted = model.predict(x, batch_size=16, verbose=0)
    assert predicted.dtype == np.float32
    np.testing.assert_allclose(
        predicted, ops.convert_to_numpy(model(x)), rtol=1e-6, atol=1e-6
    )


def test_a_callback_that_pins_the_model_during_fit():
    # `fit` calls `model.train_function` at each step: pinning makes it
    # afresh, where a first version left it None, and the next step
    # failed ("'NoneType' object is not callable", a reviewer).
    class PinAtFirstEpochEnd(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                kmp.pin_float32(self.model)

    kmp.enable("mixed_float16")
    model = _softmax_head()
    model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
    x = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    logs = model.fit(
        x, x[:, :4], epochs=2, verbose=0, callbacks=[PinAtFirstEpochEnd()]
    )
    assert len(logs.history["loss"]) == 2
    assert model.predict(x, verbose=0).dtype == np.float32


def _softmax_head():
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16)(inputs)
    outputs = keras.layers.Dense(4, activation="softmax")(hidden)
    return keras.Model(inputs, outputs)
