"""kmp.islands.feature_normalization: Keras's `Normalization` layer in float32
under kmp's 16-bit policies (its `adapt`, and `kmp.pin_float32`), against
what Keras's own mixed precision makes of it."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kmp
from kmp import backend
from kmp.islands import feature_normalization

RNG = np.random.default_rng(0)
# Raw features as a table holds them: a year (mean 2000, standard
# deviation 10), a price (standard deviation 3000: a variance of 9e6,
# over float16's largest value, 65504) and one already standardized.
FEATURES = np.stack(
    [
        RNG.normal(2000, 10, 1024),
        RNG.normal(5000, 3000, 1024),
        RNG.normal(0, 1, 1024),
    ],
    axis=1,
).astype("float32")
YEAR, PRICE = 0, 1


def _data(kind):
    """The features as `adapt` takes them: an array, or batches."""
    if kind == "array":
        return FEATURES
    if kind == "batches":
        return [FEATURES[i : i + 128] for i in range(0, len(FEATURES), 128)]
    return tf.data.Dataset.from_tensor_slices(FEATURES).batch(128)


def _normalized(layer):
    out = layer(FEATURES[:256])
    return keras.ops.convert_to_numpy(keras.ops.cast(out, "float32"))


def _float32(kind="array"):
    """The features standardized in float32 by Keras alone."""
    layer = keras.layers.Normalization(dtype="float32")
    layer.adapt(_data(kind))
    return _normalized(layer)


def test_stock_keras_zeroes_a_wide_feature_and_rounds_an_offset_one():
    # Keras's own mixed precision: the statistics are float32 (adapted
    # on an array), then cast to the compute dtype with the input.
    expected = _float32()
    keras.config.set_dtype_policy("mixed_float16")
    layer = keras.layers.Normalization()
    layer.adapt(FEATURES)
    assert keras.ops.convert_to_numpy(layer.variance)[0, PRICE] == np.inf
    price = _normalized(layer)[:, PRICE]
    assert np.all(price == 0) and np.std(expected[:, PRICE]) > 0.9

    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = keras.layers.Normalization()
    layer.adapt(FEATURES)
    # bfloat16 holds 2003.4 as 2000 or 2008: off by up to 0.4 of the
    # year's standard deviation.
    year = np.abs(_normalized(layer) - expected)[:, YEAR]
    assert year.max() > 0.3, year.max()


@pytest.mark.parametrize("kind", ["array", "batches", "dataset"])
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_adapt_under_kmp_standardizes_as_float32_does(policy, kind):
    # A dataset's batches were read in 16 bits (JAX, torch) or refused
    # by TensorFlow ("expected to be a float tensor but is a half").
    expected = _float32(kind)
    kmp.enable(policy)
    layer = keras.layers.Normalization()
    assert layer.compute_dtype != "float32"
    layer.adapt(_data(kind))
    assert layer.dtype_policy.name == "float32"
    assert keras.backend.standardize_dtype(layer.adapt_mean.dtype) == "float32"
    np.testing.assert_allclose(_normalized(layer), expected, atol=1e-6)


def test_a_layer_made_in_a_policy_scope_adapts_in_float32_after_it():
    # Built inside the block, adapted after it (kmp's adapt no longer in
    # place): it built in float32, so Keras's own adapt reads float32.
    expected = _float32("dataset")
    with kmp.policy_scope("mixed_float16"):
        layer = keras.layers.Normalization()
        inputs = keras.Input((3,))
        keras.Model(inputs, keras.layers.Dense(2)(layer(inputs)))
    layer.adapt(_data("dataset"))
    assert layer.dtype_policy.name == "float32"
    np.testing.assert_allclose(_normalized(layer), expected, atol=1e-6)


def test_bfloat16_master_weights_keep_float32_statistics():
    expected = _float32()
    kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    layer = keras.layers.Normalization()
    layer.adapt(FEATURES)
    assert keras.backend.standardize_dtype(layer.adapt_mean.dtype) == "float32"
    np.testing.assert_allclose(_normalized(layer), expected, atol=1e-6)


def test_pin_float32_remakes_built_layers_statistics_in_float32():
    expected = _float32()
    # Built and adapted under Keras's own mixed precision (kmp's adapt
    # not in place), nested in a model of their own.
    keras.config.set_dtype_policy("mixed_float16")
    given = keras.layers.Normalization(
        mean=FEATURES.mean(0), variance=FEATURES.var(0), name="given"
    )
    adapted = keras.layers.Normalization(name="adapted")
    adapted.adapt(FEATURES)
    inputs = keras.Input((3,))
    inner = keras.Sequential([given], name="inner")
    model = keras.Model(inputs, [inner(inputs), adapted(inputs)])
    paths = given.path, adapted.path
    assert np.all(_normalized(given)[:, PRICE] == 0)
    assert np.all(_normalized(adapted)[:, PRICE] == 0)
    # kmp.audit says so before.
    found = {
        f.where: f
        for f in kmp.audit(model, verbose=False)
        if "Normalization" in f.problem
    }
    assert [found[where].severity for where in paths] == ["error"] * 2
    largest = f"{FEATURES.var(0).max():.4g}"
    assert f"reach {largest}, over float16's largest value (65504)" in (
        found["inner/given"].problem
    )

    assert kmp.pin_float32(model) is model
    assert (given.path, adapted.path) == paths
    for layer in (given, adapted):
        assert layer.dtype_policy.name == "float32"
        np.testing.assert_allclose(_normalized(layer), expected, atol=1e-4)
    report = kmp.audit(model, verbose=False)
    assert not [f for f in report if "Normalization" in f.problem], report


def test_a_pinned_normalization_comes_back_from_a_keras_file(tmp_path):
    kmp.enable("mixed_float16")
    layer = keras.layers.Normalization()
    layer.adapt(FEATURES)
    model = kmp.pin_float32(
        keras.Sequential([keras.Input((3,)), layer, keras.layers.Dense(2)])
    )
    model.compile(optimizer=kmp.wrap("adam"), loss="mse")
    model.save(tmp_path / "model.keras")
    loaded = kmp.load_model(tmp_path / "model.keras")
    assert loaded.layers[0].dtype_policy.name == "float32"
    np.testing.assert_array_equal(
        loaded.predict(FEATURES, verbose=0), model.predict(FEATURES, verbose=0)
    )


def test_keras_io_feature_space_keeps_a_wide_feature():
    # keras-io's "Structured data classification with FeatureSpace": its
    # numeric features are "float_normalized", a Normalization adapted
    # on a tf.data dataset, encoded in the tf.data pipeline.
    data = {"price": FEATURES[:, PRICE], "city": RNG.choice(["a", "b"], 1024)}
    features = {"price": "float_normalized", "city": "string_categorical"}

    def encoded(space):
        dataset = tf.data.Dataset.from_tensor_slices(data).batch(128)
        space.adapt(dataset)
        batch = next(iter(dataset.map(space)))
        return np.asarray(batch, "float32")

    expected = encoded(keras.utils.FeatureSpace(features, output_mode="concat"))
    kmp.enable("mixed_float16")
    got = encoded(keras.utils.FeatureSpace(features, output_mode="concat"))
    assert np.std(got[:, -1]) > 0.9  # the price, last: 0 under Keras's
    np.testing.assert_allclose(got, expected, atol=2e-3)  # a float16 concat


def test_kmp_disable_puts_keras_s_build_and_adapt_back():
    keras_s = dict(keras.layers.Normalization.__dict__)

    def in_place(name):
        return keras.layers.Normalization.__dict__[name] is keras_s[name]

    kmp.enable("mixed_float16")
    assert backend.dtype_notes_on()
    assert not in_place("adapt") and not in_place("build")
    with kmp.policy_scope("float32"):
        assert in_place("adapt") and in_place("build")
    assert backend.dtype_notes_on()
    kmp.disable()
    assert in_place("adapt") and in_place("build")
    assert not backend.dtype_notes_on()
    # A float32 layer under a 16-bit policy is left as it is.
    kmp.enable("mixed_float16")
    layer = keras.layers.Normalization(dtype="float32")
    assert not feature_normalization.normalize_in_float32(layer)


# A 16-bit image's values, the largest 65535, as a uint16 input holds them.
IMAGE = np.array([[0, 1000, 1001, 1003, 65504, 65519, 65520, 65535]], "uint16")


def _rescaling_model():
    inputs = keras.Input((IMAGE.shape[1],), dtype="uint16")
    scaled = keras.layers.Rescaling(1 / 65535, name="scale")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(scaled))


def _scaled(model):
    out = model.get_layer("scale")(IMAGE)
    return keras.ops.convert_to_numpy(keras.ops.cast(out, "float32"))


def test_stock_keras_rescaling_loses_a_16_bit_image():
    # Keras casts the input to the compute dtype, then scales it.
    keras.config.set_dtype_policy("mixed_float16")
    scaled = _scaled(_rescaling_model())[0]
    assert np.isfinite(scaled[:6]).all()
    assert np.isinf(scaled[6:]).all()  # 65520 and 65535: inf
    keras.config.set_dtype_policy("mixed_bfloat16")
    scaled = _scaled(_rescaling_model())[0]
    assert scaled[1] == scaled[2]  # 1000 and 1001 read alike: 1000


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_pin_float32_rescales_in_float32(policy, tmp_path):
    expected = IMAGE.astype("float64") / 65535
    kmp.enable(policy)
    model = kmp.pin_float32(_rescaling_model())
    layer = model.get_layer("scale")
    assert layer.dtype_policy.name == "float32"
    np.testing.assert_allclose(_scaled(model), expected, rtol=1e-6)
    assert keras.ops.convert_to_numpy(model(IMAGE)).dtype == "float32"
    # The next layer casts the float32 output: the model trains.
    model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
    x = np.repeat(IMAGE, 8, axis=0)
    logs = model.fit(x, np.ones((8, 1)), verbose=0).history
    assert np.isfinite(logs["loss"][-1])
    model.save(tmp_path / "model.keras")
    loaded = kmp.load_model(tmp_path / "model.keras")
    assert loaded.get_layer("scale").dtype_policy.name == "float32"
    np.testing.assert_allclose(_scaled(loaded), expected, rtol=1e-6)


def test_a_rescaling_of_a_16_bit_layer_s_output_keeps_its_policy():
    # ResNet-9's logits scaled by 0.125 (examples/cifar10.py): its input
    # is a float16 Dense's output, no raw value.
    kmp.enable("mixed_float16")
    inputs = keras.Input((4,))
    raw = keras.layers.Rescaling(1 / 255, name="raw")(inputs)
    logits = keras.layers.Dense(2)(raw)
    scaled = keras.layers.Rescaling(0.125, name="scaled")(logits)
    model = keras.Model(inputs, keras.layers.Softmax()(scaled))
    kmp.pin_float32(model)
    assert model.get_layer("raw").compute_dtype == "float32"
    assert model.get_layer("scaled").compute_dtype == "float16"
    # A layer with no graph to read (a subclassed model's) reads raw
    # values as far as pinning knows.
    assert feature_normalization.reads_raw_values(keras.layers.Rescaling(2.0))


def test_a_rescaling_outside_16_bits_is_left_as_it_is():
    kmp.enable("mixed_float16")
    layer = keras.layers.Rescaling(0.5, dtype="float32")
    assert not feature_normalization.rescale_in_float32(layer)
    kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    layer = keras.layers.Rescaling(0.5)
    assert feature_normalization.rescale_in_float32(layer)
    assert layer.compute_dtype == "float32"
    assert layer.variable_dtype == "bfloat16"  # the mode's, kept


def test_a_spectrogram_under_bfloat16_computes_in_float32_once_pinned():
    # keras-io's speech examples read raw audio through Keras's
    # STFTSpectrogram, which refuses bfloat16 at its first call (a
    # helper's run, 2026-11-30; stock mixed_bfloat16 alike); float16 it
    # takes.
    audio = np.random.default_rng(0).uniform(-1, 1, (2, 1024, 1))
    audio = audio.astype("float32")

    def stft():
        return keras.layers.STFTSpectrogram(
            frame_length=256, frame_step=128, name="stft"
        )

    expected = keras.ops.convert_to_numpy(stft()(audio))  # float32
    keras.config.set_dtype_policy("mixed_bfloat16")  # Keras's own
    with pytest.raises(TypeError, match="Invalid input type"):
        stft()(audio)
    kmp.enable("mixed_bfloat16")
    inputs = keras.Input((1024, 1))
    spectrogram = stft()(inputs)  # a symbolic build does not call it
    pooled = keras.layers.GlobalAveragePooling1D()(spectrogram)
    model = keras.Model(inputs, keras.layers.Dense(2)(pooled))
    (finding,) = [
        f for f in kmp.audit(model, verbose=False) if f.where == "stft"
    ]
    assert finding.severity == "error"
    assert finding.problem.startswith("STFTSpectrogram computes in bfloat16")
    kmp.pin_float32(model)
    layer = model.get_layer("stft")
    assert layer.compute_dtype == "float32"
    assert not [f for f in kmp.audit(model, verbose=False) if f.where == "stft"]
    model(audio)
    got = keras.ops.convert_to_numpy(layer(audio))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    kmp.enable("mixed_float16")  # float16 it takes: left as it is
    assert not feature_normalization.is_bfloat16_spectrogram(stft())
