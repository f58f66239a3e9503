"""When an optimizer's memory mode is decided (`kmp.memory.modes`): the
default rounding of bfloat16 weights is decided when the optimizer is
built, from its weights, so that `kmp.wrap` may come before
`kmp.enable(..., master_weights="bfloat16")`; float32 weights get
Keras's own optimizer, to the bit."""

import keras
import numpy as np

import kmp
from kmp.memory import optimizer_state


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(1),
        ]
    )


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 16)).astype("float32")
    return x, x.mean(axis=1, keepdims=True)


def _trained(optimizer, model=None, steps=4):
    model = model or _model()
    model.compile(optimizer=optimizer, loss="mse")
    x, y = _data()
    model.fit(x, y, batch_size=16, steps_per_epoch=steps, verbose=0)
    return model


def _weights(model):
    return [
        keras.ops.convert_to_numpy(keras.ops.cast(w, "float32"))
        for w in model.weights
    ]


def test_wrap_before_enable_rounds_bfloat16_masters_stochastically():
    kmp.enable("float32")
    early = kmp.wrap(keras.optimizers.AdamW(1e-3, weight_decay=0.1))
    # What it will do to bfloat16 weights, before it has seen any.
    assert optimizer_state.rounding_of(early) == "stochastic"
    kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    before = _trained(early)
    late = kmp.wrap(keras.optimizers.AdamW(1e-3, weight_decay=0.1))
    after = _trained(late)
    assert type(early) is type(late)
    assert type(early).__name__ == "LowPrecisionAdamW"
    assert optimizer_state.rounding_of(early) == "stochastic"
    for a, b in zip(_weights(before), _weights(after)):
        np.testing.assert_array_equal(a, b)
    # Rounded to nearest, the same run is another run (the mode whose
    # small updates vanish).
    nearest = _trained(
        kmp.wrap(
            keras.optimizers.AdamW(1e-3, weight_decay=0.1), rounding="nearest"
        )
    )
    assert any(
        np.any(a != b) for a, b in zip(_weights(nearest), _weights(after))
    )


def test_float32_weights_get_keras_s_own_optimizer_to_the_bit():
    kmp.enable("mixed_bfloat16")  # float32 master weights
    stock = _trained(keras.optimizers.Adam(1e-2))
    optimizer = kmp.wrap(keras.optimizers.Adam(1e-2))
    assert type(optimizer).__name__ == "RoundingAtBuildAdam"
    ours = _trained(optimizer)
    assert type(optimizer) is type(stock.optimizer)
    for a, b in zip(_weights(ours), _weights(stock)):
        np.testing.assert_array_equal(a, b)


def test_a_file_saved_before_the_build_decides_when_loaded(tmp_path):
    kmp.enable("float32")
    optimizer = kmp.wrap(keras.optimizers.Adam(1e-2), seed=7)
    kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    model = _model()
    model.compile(optimizer=optimizer, loss="mse")
    path = str(tmp_path / "unbuilt.keras")
    model.save(path)
    # Keras builds the optimizer of a built model it loads: on its
    # bfloat16 weights, the low-precision class, with the seed asked for.
    loaded = kmp.load_model(path)
    assert type(loaded.optimizer).__name__ == "LowPrecisionAdam"
    assert optimizer_state.rounding_of(loaded.optimizer) == "stochastic"
    assert loaded.optimizer._rounding_seed == 7
    _trained(loaded.optimizer, model=loaded, steps=1)
