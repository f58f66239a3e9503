"""kmp.islands.pin_mark: a `.keras` file records that its model was
pinned, and `kmp.load_model` pins what it loads by it alone where the
config shows nothing (a model whose every output is cast)."""

import zipfile

import keras
import numpy as np

import kmp
from kmp.islands import float32_outputs
from kmp.islands import pin_mark


def _dtype(x):
    return keras.backend.standardize_dtype(x.dtype)


def _marked(path):
    with zipfile.ZipFile(path) as archive:
        return pin_mark.pinned_in(archive)


@keras.saving.register_keras_serializable(package="kmp_tests")
class NotedResidual(keras.layers.Layer):
    """A layer of layers, no attention in it, that keeps a file of its own
    in a `.keras` archive (as a lookup keeps its vocabulary)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(16)
        self.note = "unread"

    def call(self, x):
        return x + self.dense(x)

    def save_assets(self, dir_path):
        with open(f"{dir_path}/note.txt", "w") as f:
            f.write("kept")

    def load_assets(self, dir_path):
        with open(f"{dir_path}/note.txt") as f:
            self.note = f.read()


@keras.saving.register_keras_serializable(package="kmp_tests")
class BlockOf(keras.layers.Layer):
    """A block whose attention its own code makes (a KerasHub encoder's
    shape): the attention's softmax has no path a config could pin."""

    def __init__(self, attention=None, **kwargs):
        super().__init__(**kwargs)
        self.attention = attention or keras.layers.MultiHeadAttention(2, 8)

    def call(self, x):
        return x + self.attention(x, x)

    def get_config(self):
        return super().get_config()


def _extractor(name="extractor"):
    inputs = keras.Input((16,))
    return keras.Model(inputs, NotedResidual(name="block")(inputs), name=name)


def test_a_model_whose_every_output_is_cast_comes_back_casting(tmp_path):
    # Its one output is cast, not pinned: the config records a 16-bit
    # policy there and no island class, so kmp.load_model took it for a
    # model saved unpinned and it came back returning float16.
    kmp.enable("mixed_float16")
    model = kmp.pin_float32(_extractor())
    x = np.random.default_rng(0).normal(size=(4, 16)).astype("float32")
    path = str(tmp_path / "extractor.keras")
    model.save(path)
    assert _marked(path)
    # Keras's load rebuilds it from its config, without the cast.
    assert _dtype(keras.saving.load_model(path)(x)) == "float16"
    loaded = kmp.load_model(path)
    block = loaded.get_layer("block")
    assert float32_outputs.returns_float32(block)
    assert block.compute_dtype == "float16"
    assert block.note == "kept"  # a layer's own file, beside the mark
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(x)),
        keras.ops.convert_to_numpy(model(x)),
    )
    assert _dtype(loaded(x)) == "float32"
    loaded.save(path)  # loaded pinned, it is marked again
    assert _marked(path)


def test_an_unpinned_model_has_no_mark_and_comes_back_as_saved(tmp_path):
    kmp.enable("mixed_float16")
    model = _extractor()
    path = str(tmp_path / "unpinned.keras")
    model.save(path)
    assert not _marked(path)
    loaded = kmp.load_model(path)
    assert not float32_outputs.returns_float32(loaded.get_layer("block"))
    assert _dtype(loaded(np.ones((2, 16), "float32"))) == "float16"


def test_a_pinned_model_inside_one_saved_unpinned_does_not_pin_it(tmp_path):
    # Reviews: a mark anywhere in the archive pinned the whole (a float32
    # head, predicting otherwise), and so did a mark on an inner layer
    # whose name a layer of the outer model took again ("dense").
    kmp.enable("mixed_float16")
    inputs = keras.Input((16,))
    backbone = kmp.pin_float32(_extractor("backbone"))
    head = keras.layers.Dense(3, activation="softmax", name="block")
    model = keras.Model(inputs, head(backbone(inputs)))
    path = str(tmp_path / "unpinned.keras")
    model.save(path)
    assert not _marked(path)
    loaded = kmp.load_model(path)
    assert loaded.get_layer("block").compute_dtype == "float16"
    x = np.random.default_rng(0).normal(size=(4, 16)).astype("float32")
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(x)),
        keras.ops.convert_to_numpy(model(x)),
    )


def test_deleting_the_instance_s_save_assets_removes_the_mark(tmp_path):
    kmp.enable("mixed_float16")
    model = kmp.pin_float32(_extractor())
    del model.save_assets
    path = str(tmp_path / "unmarked.keras")
    model.save(path)
    assert not _marked(path)
    pin_mark.mark_pinned(model)
    pin_mark.mark_pinned(model)  # once: one mark, one wrapper
    model.save(path)
    assert _marked(path)


def test_a_model_held_by_a_pinned_one_saved_on_its_own_comes_back_pinned(
    tmp_path,
):
    # keras-io's pretraining guide pins nothing itself; under kmp its
    # pretraining model is pinned, and its encoder, saved on its own,
    # came back with its attention's softmax in 16 bits: predictions
    # off by 0.002 (a helper, KerasHub's TransformerEncoder).
    kmp.enable("mixed_float16")
    inputs = keras.Input((6, 16))
    block = keras.layers.MultiHeadAttention(2, 8)
    encoder = keras.Model(inputs, BlockOf(block)(inputs), name="encoder")
    outer_inputs = keras.Input((6, 16))
    head = keras.layers.Dense(4, activation="softmax")
    kmp.pin_float32(keras.Model(outer_inputs, head(encoder(outer_inputs))))
    path = str(tmp_path / "encoder.keras")
    encoder.save(path)
    assert _marked(path)
    # The block's code rebuilds its attention, unpinned, on any load.
    plain = kmp.load_model(path, pin=False).layers[-1].attention
    assert type(plain) is keras.layers.MultiHeadAttention
    loaded = kmp.load_model(path)
    assert type(loaded.layers[-1].attention) is kmp.layers.MultiHeadAttention
    x = np.random.default_rng(0).normal(size=(2, 6, 16)).astype("float32")
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(x)),
        keras.ops.convert_to_numpy(encoder(x)),
    )
