"""kmp.diagnose on models with planted faults, on clean models, and the
promise that it changes nothing."""

import json
import math

import keras
import numpy as np
import pytest
from absl.testing import parameterized
from util import overflow_model

import kmp
from kmp.doctor.numerics import FORMATS
from kmp.examples import cifar10
from kmp.examples import imdb

F16 = FORMATS["float16"]


def _row(report, name):
    """The row of the layer with this path, or this last path component."""
    (row,) = [
        r for r in report.layers if name in (r.path, r.path.split("/")[-1])
    ]
    return row


def _mlp(loss="sparse_categorical_crossentropy", policy="mixed_float16"):
    # Seeded: the weights, and so the figures asserted below, must not
    # depend on which tests ran before in the same process (one JAX run
    # measured a relative error of 0.055 against the 0.05 bound).
    keras.utils.set_random_seed(0)
    with kmp.policy_scope(policy):
        inputs = keras.Input((16,))
        x = keras.layers.Dense(32, activation="relu", name="hidden")(inputs)
        x = keras.layers.Dense(10, name="logits")(x)
        outputs = keras.layers.Softmax(name="probabilities")(x)
        model = kmp.pin_float32(keras.Model(inputs, outputs, name="mlp"))
    model.compile(optimizer=kmp.wrap("sgd"), loss=loss)
    return model


def _classification(n=64, features=16, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(n, features)).astype("float32"),
        rng.integers(0, 10, n),
    )


def _state(model):
    """Everything diagnose must leave alone."""
    variables = [*model.variables, *model.optimizer.variables]
    return {
        "values": [keras.ops.convert_to_numpy(v).copy() for v in variables],
        "policies": [
            (layer, layer._dtype_policy)
            for layer in model._flatten_layers(include_self=True)
        ],
        "calls": [
            layer
            for layer in model._flatten_layers(include_self=True)
            if "call" in layer.__dict__
        ],
        "global": keras.config.dtype_policy().name,
    }


def _assert_unchanged(before, after):
    for old, new in zip(before["values"], after["values"]):
        np.testing.assert_array_equal(old, new)
    assert len(before["values"]) == len(after["values"])
    for (layer, old), (_, new) in zip(before["policies"], after["policies"]):
        assert old is new, layer.name
    assert before["calls"] == after["calls"] == []
    assert before["global"] == after["global"]


class DoctorTest(parameterized.TestCase):
    def test_overflowing_layer_is_pinned_and_repinning_converges(self):
        model = overflow_model()
        x = np.random.default_rng(0).uniform(1.7, 2.0, (32, 4))
        data = (x.astype("float32"), np.zeros((32, 1), "float32"))

        report = kmp.diagnose(model, data, batch_size=16, verbose=False)
        big = _row(report, "big")
        assert big.verdict == "pin to float32"
        assert big.activations.overflow == 1.0
        assert "exceed 65504" in big.reasons[0]
        assert report.pin == ["big"]
        assert report.pin_call() == 'kmp.pin_float32(model, also=[r"big"])'
        # Downstream layers inherit the inf; only the cause is named.
        assert _row(report, "shrink").verdict == "ok"

        # Pinning "big" moves the overflow to the cast of shrink's input:
        # the next run names it, and then the model is clean.
        kmp.pin_float32(model, also=["big"])
        report = kmp.diagnose(model, data, batch_size=16, verbose=False)
        assert report.pin == ["shrink"]
        assert "cast to float16" in _row(report, "shrink").reasons[0]
        kmp.pin_float32(model, also=["shrink"])
        report = kmp.diagnose(model, data, batch_size=16, verbose=False)
        assert report.pin == []
        assert _row(report, "big").verdict == "float32"

    def test_tiny_loss_underflows_at_scale_one_until_recommended_scale(self):
        def tiny_loss(y, p):
            return 1e-7 * keras.losses.sparse_categorical_crossentropy(y, p)

        model = _mlp(loss=tiny_loss)
        data = _classification()
        report = kmp.diagnose(
            model, data, loss_scale=1.0, batch_size=32, verbose=False
        )
        assert report.verdicts[0].startswith("loss scale too low: at 2^0")
        assert report.gradients.lost_scaled > 0.5
        assert report.gradients.measured_lost > 0.5
        lo, hi = report.scale_range
        assert lo <= hi

        fixed = kmp.diagnose(
            model, data, loss_scale=2.0**lo, batch_size=32, verbose=False
        )
        assert fixed.verdicts[0].startswith("loss scale ok")
        assert fixed.gradients.lost_scaled <= 0.01
        # Measured in the float16 run itself, not predicted.
        assert fixed.gradients.measured_lost <= 0.02
        assert _row(fixed, "hidden").weight_gradients.relative_error < 0.05
        assert report.pin == fixed.pin == []

    def test_fractions_match_numpy(self):
        with kmp.policy_scope("mixed_float16"):
            model = keras.Sequential(
                [
                    keras.Input((4,)),
                    keras.layers.Dense(
                        4,
                        use_bias=False,
                        kernel_initializer="identity",
                        name="identity",
                    ),
                ]
            )
        model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
        x = np.array(
            [
                [1e-9, 3e-8, 1e-6, 2e-5],
                [0.0, -0.5, 3.0, 1e-7],
                [-4e-9, 0.25, 700.0, -1e-3],
                [5e-6, 0.0, -2e-8, 9.0],
            ],
            "float32",
        )
        y = np.zeros_like(x)
        scale = 1024.0  # 700 / 8 * 1024 overflows float16: one value
        report = kmp.diagnose(
            model, (x, y), loss_scale=scale, batch_size=4, verbose=False
        )
        act = _row(report, "identity").activations
        nonzero = np.abs(x[x != 0])
        assert act.max_abs == 700.0
        assert act.lost == np.mean(nonzero < 2.0**-24)
        assert act.subnormal == np.mean(nonzero < 2.0**-14)
        assert act.overflow == 0.0
        assert act.headroom == pytest.approx(math.log2(65504 / 700))
        x16 = x.astype("float16").astype("float32")
        expected = np.linalg.norm(x16 - x) / np.linalg.norm(x)
        assert act.relative_error == pytest.approx(expected, rel=1e-5)

        # mse's gradient by the output is 2 (y_pred - y) / 16 = y_pred / 8.
        grads = _row(report, "identity").activation_gradients
        reference = np.abs(x[x != 0]) / 8
        assert grads.max_abs == pytest.approx(700.0 / 8)
        assert grads.lost == np.mean(reference < 2.0**-24)
        assert grads.lost_scaled == np.mean(reference * scale < 2.0**-24)
        assert grads.overflow_scaled == np.mean(reference * scale > 65504)
        assert grads.overflow_scaled == 1 / 14  # 14 nonzero values
        with np.errstate(over="ignore"):
            measured = (x16 / 8 * scale).astype("float16")
        assert grads.measured_lost == np.mean(measured[x != 0] == 0)
        assert grads.measured_nonfinite == np.mean(np.isinf(measured))

        # The kernel's gradient: x^T (x / 8), in float32.
        kernel = _row(report, "identity").weight_gradients
        expected = np.abs(x.T.astype("float64") @ (x / 8))
        nonzero = expected[expected != 0]
        assert kernel.max_abs == pytest.approx(nonzero.max(), rel=1e-6)
        assert kernel.lost == np.mean(nonzero < 2.0**-24)
        assert kernel.overflow_scaled == np.mean(nonzero * scale > 65504)

    @pytest.mark.slow
    def test_clean_convnet_gets_no_pin(self):
        with kmp.policy_scope("mixed_float16"):
            model = cifar10.compile_model(cifar10.Config(width=8), steps=1)
        images = np.random.default_rng(0).normal(size=(32, 32, 32, 3))
        labels = np.arange(32) % 10
        before = _state(model)
        report = kmp.diagnose(
            model,
            (images.astype("float32"), labels),
            batch_size=16,
            verbose=False,
        )
        _assert_unchanged(before, _state(model))
        assert report.pin == []
        assert {r.verdict for r in report.layers} == {"ok", "float32"}
        assert _row(report, "softmax").verdict == "float32"
        lo, hi = report.scale_range
        assert lo <= 15 <= hi  # kmp.wrap's initial scale, 2^15, fits
        assert report.loss_scale == 2.0**15
        assert report.recommended_policy == "mixed_float16"
        assert report.examples == 32 and report.batches == 2
        # Every conv, BN and ReLU is seen, in call order.
        paths = [r.path for r in report.layers]
        assert paths[:3] == ["conv2d", "batch_normalization", "re_lu"]

    @pytest.mark.slow
    def test_clean_transformer_gets_no_pin(self):
        config = imdb.Config(
            d_model=16,
            heads=2,
            layers=1,
            sequence_length=16,
            vocabulary_size=100,
        )
        with kmp.policy_scope("mixed_float16"):
            model = imdb.compile_model(config, steps=1)
        tokens = np.random.default_rng(0).integers(1, 100, (16, 16))
        report = kmp.diagnose(
            model,
            (tokens.astype("int32"), np.arange(16) % 2),
            batch_size=8,
            verbose=False,
        )
        assert report.pin == []
        paths = [r.path for r in report.layers]
        # Inside MultiHeadAttention, in call order. The attention layer
        # returns its output projection's tensor: one row, not two.
        inside = [p for p in paths if p.startswith("attention_0")]
        assert inside[:3] == [
            "attention_0/query",
            "attention_0/key",
            "attention_0/value",
        ]
        assert inside[-1] == "attention_0/attention_output"
        assert "attention_0" not in paths
        # Dropout is off in both runs (same values), so not a row.
        assert not any("dropout" in p for p in paths)
        # The token embedding's gradient (IndexedSlices on TensorFlow).
        tokens = _row(report, "token_and_position_embedding/embedding")
        assert tokens.weight_gradients.max_abs > 0

    def test_leaves_model_and_policy_unchanged_on_error_too(self):
        with kmp.policy_scope("mixed_float16"):
            inputs = keras.Input((8,))
            x = keras.layers.Dense(8)(inputs)
            x = keras.layers.BatchNormalization()(x)
            x = keras.layers.Dropout(0.5)(x)
            outputs = keras.layers.Dense(3, activation="softmax")(x)
            model = kmp.pin_float32(keras.Model(inputs, outputs))
        model.compile(
            optimizer=kmp.wrap("adam"), loss="sparse_categorical_crossentropy"
        )
        x, y = _classification(32, 8)
        y = y % 3
        model.fit(x, y, epochs=1, verbose=0)  # optimizer state exists
        before = _state(model)
        kmp.diagnose(model, (x, y), verbose=False)
        _assert_unchanged(before, _state(model))

        def broken(y_true, y_pred):
            raise RuntimeError("loss failed")

        with pytest.raises(RuntimeError, match="loss failed"):
            kmp.diagnose(model, (x, y), loss=broken, verbose=False)
        _assert_unchanged(before, _state(model))
        # And the model still trains as before.
        model.fit(x, y, epochs=1, verbose=0)

    def test_sequential_and_subclassed_models(self):
        class Residual(keras.Model):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.inner = keras.layers.Dense(16, name="inner")
                self.out = keras.layers.Dense(10, name="out")

            def call(self, x):
                return self.out(keras.ops.relu(self.inner(x)) + x)

        with kmp.policy_scope("mixed_float16"):
            subclassed = Residual(name="residual")
            subclassed(np.zeros((1, 16), "float32"))
            sequential = keras.Sequential(
                [keras.Input((16,)), keras.layers.Dense(10, name="only")]
            )
        data = _classification()
        for model in (subclassed, sequential):
            report = kmp.diagnose(
                model,
                data,
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True
                ),
                verbose=False,
            )
            assert report.pin == []
            assert report.loss_scale == 1.0  # not compiled: no scaler
            assert report.verdicts[0].startswith("loss scale ok: at 2^0")
        paths = [r.path for r in report.layers]
        assert paths == ["sequential/only"]
        report = kmp.diagnose(
            subclassed,
            data,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            loss_scale=2.0**10,
            verbose=False,
        )
        assert [r.path for r in report.layers] == [
            "residual/inner",
            "residual/out",
        ]
        assert any("subclassed model" in note for note in report.notes)
        assert report.layers[0].activation_gradients is not None

    def test_float32_model_is_tested_under_the_policy_and_kept_float32(self):
        model = _mlp(policy="float32")
        data = _classification()
        report = kmp.diagnose(model, data, verbose=False)
        assert report.policy == "mixed_float16"
        assert _row(report, "hidden").dtype == "float16"
        # As kmp.pin_float32 would leave it: the softmax output float32.
        assert _row(report, "probabilities").dtype == "float32"
        assert "float32 model" in report.notes[-1]
        assert all(
            layer.compute_dtype == "float32"
            for layer in model._flatten_layers()
        )
        bf16 = kmp.diagnose(model, data, policy="mixed_bfloat16", verbose=False)
        assert bf16.policy == "mixed_bfloat16"
        assert _row(bf16, "hidden").dtype == "bfloat16"
        assert bf16.scale_range is None and bf16.loss_scale == 1.0
        assert bf16.verdicts[0].startswith("bfloat16 has float32's range")
        assert bf16.recommended_policy == "mixed_bfloat16"
        assert bf16.format.name == "bfloat16"

    def test_mixed_model_switches_half_layers_only(self):
        model = _mlp()  # mixed_float16, output softmax pinned
        report = kmp.diagnose(
            model, _classification(), policy="mixed_bfloat16", verbose=False
        )
        assert _row(report, "hidden").dtype == "bfloat16"
        assert _row(report, "probabilities").dtype == "float32"
        assert model.get_layer("hidden").compute_dtype == "float16"

    def test_bfloat16_master_weights_are_read_as_float32_in_the_reference(
        self,
    ):
        # `kmp doctor --master_weights=bfloat16`: a float32 convolution
        # would get the bfloat16 kernel as stored and refuse it.
        keras.utils.set_random_seed(0)
        with kmp.policy_scope("mixed_bfloat16", master_weights="bfloat16"):
            inputs = keras.Input((8, 8, 3))
            x = keras.layers.Conv2D(4, 3, name="hidden")(inputs)
            x = keras.layers.GlobalAveragePooling2D()(x)
            model = keras.Model(inputs, keras.layers.Dense(10)(x))
        model.compile(
            optimizer=kmp.wrap("sgd"),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        images = np.random.default_rng(0).normal(size=(32, 8, 8, 3))
        data = (images.astype("float32"), np.arange(32) % 10)
        report = kmp.diagnose(model, data, verbose=False)
        hidden = _row(report, "hidden")
        assert hidden.dtype == "bfloat16"
        # The same weights on both sides: bfloat16's rounding of the
        # activations alone (2^-8 relative), not of the weights too.
        assert 0 < hidden.activations.relative_error < 2.0**-7
        assert any("weights stored in bfloat16" in n for n in report.notes)
        assert model.get_layer("hidden").kernel.dtype == "bfloat16"

    def test_with_and_without_xla_agree(self):
        model, data = _mlp(), _classification()
        reports = [
            kmp.diagnose(model, data, jit_compile=jit, verbose=False)
            for jit in (True, False)
        ]
        assert reports[0].pin == reports[1].pin == []
        assert reports[0].scale_range == reports[1].scale_range
        for a, b in zip(reports[0].layers, reports[1].layers):
            assert a.path == b.path
            assert a.activations.max_abs == pytest.approx(
                b.activations.max_abs, rel=1e-3
            )
            assert a.activations.lost == b.activations.lost

    def test_several_outputs_take_their_losses_by_name(self):
        with kmp.policy_scope("float32"):
            inputs = keras.Input((16,))
            hidden = keras.layers.Dense(8, name="hidden")(inputs)
            zeta = keras.layers.Dense(1, name="zeta")(hidden)
            alpha = keras.layers.Dense(3, name="alpha")(hidden)
            model = keras.Model(inputs, [zeta, alpha])
        x, _ = _classification(16)
        yz = np.full((16, 1), 100.0, "float32")  # far: mae's gradient 1/16
        ya = np.zeros((16, 3), "float32")

        def grad_max(report, name):
            grads = _row(report, name).activation_gradients
            return 0.0 if grads is None else grads.max_abs

        # Dict keys in another order than the outputs: matched by name.
        report = kmp.diagnose(
            model,
            (x, {"alpha": ya, "zeta": yz}),
            loss={"alpha": "mse", "zeta": "mae"},
            batch_size=16,
            verbose=False,
        )
        assert grad_max(report, "zeta") == pytest.approx(1 / 16)
        # mse on alpha: 2 (y_pred - 0) / (16 * 3), y_pred from float32.
        alpha_pred = keras.ops.convert_to_numpy(model(x)[1])
        mse_grad = np.abs(2 * alpha_pred / 48).max()
        assert grad_max(report, "alpha") == pytest.approx(mse_grad, rel=1e-5)
        # A None entry: no loss on that output.
        report = kmp.diagnose(
            model,
            (x, [yz, ya]),
            loss=[None, "mse"],
            batch_size=16,
            verbose=False,
        )
        assert grad_max(report, "zeta") == 0.0
        # One loss for every output, as compile takes it.
        report = kmp.diagnose(
            model, (x, [yz, ya]), loss="mae", batch_size=16, verbose=False
        )
        assert grad_max(report, "zeta") == pytest.approx(1 / 16)
        assert grad_max(report, "alpha") == pytest.approx(1 / 48)

    def test_all_zero_half_precision_gradients_are_said_not_crashed_on(self):
        with kmp.policy_scope("mixed_float16"):
            inputs = keras.Input((16,))
            x = keras.layers.Dense(8, name="body")(inputs)
            outputs = keras.layers.Dense(
                1, kernel_initializer="zeros", name="head"
            )(x)
            model = kmp.pin_float32(keras.Model(inputs, outputs))
        model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
        x, _ = _classification()
        report = kmp.diagnose(model, (x, np.ones((64, 1))), verbose=False)
        assert report.verdicts[0].startswith(
            "no nonzero half-precision gradients were measured"
        )
        assert report.recommended_policy == "mixed_float16"
        assert "loss scale: no gradients measured" in report.summary()

    def test_layers_inside_a_loop_fall_back_to_top_level(self):
        # TensorFlow's XLA cannot differentiate this unbounded while loop
        # (fit with jit_compile=True fails too): eager there, jit on JAX.
        jit_compile = keras.backend.backend() == "jax"

        class Twice(keras.layers.Layer):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.inner = keras.layers.Dense(16, name="inner")

            def build(self, shape):
                self.inner.build(shape)

            def call(self, x):
                return keras.ops.fori_loop(0, 2, lambda i, h: self.inner(h), x)

        with kmp.policy_scope("mixed_float16"):
            inputs = keras.Input((16,))
            x = Twice(name="twice")(inputs)
            outputs = keras.layers.Dense(10, name="head")(x)
            model = keras.Model(inputs, outputs)
        report = kmp.diagnose(
            model,
            _classification(),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit_compile,
            verbose=False,
        )
        paths = [r.path for r in report.layers]
        assert paths[-1] == "head"
        if paths[0] == "twice/inner":
            # An eager loop (TensorFlow without XLA) runs the inner layer
            # twice in Python: both calls are tapped, and "twice" returns
            # inner's tensor, so it is not a row of its own.
            assert not report.notes
        else:  # a traced loop: lax.fori_loop, or tf.while_loop in a graph
            assert paths == ["twice", "head"]
            assert "only the model's top-level layers" in report.notes[0]

    def test_a_failure_in_the_mixed_run_restores_everything(self):
        class Fragile(keras.layers.Dense):
            def call(self, x):
                if self.compute_dtype == "bfloat16":
                    raise FloatingPointError("no bfloat16 here")
                return super().call(x)

        with kmp.policy_scope("float32"):
            inputs = keras.Input((16,))
            x = Fragile(8, name="fragile")(inputs)
            outputs = keras.layers.Dense(10, name="head")(x)
            model = keras.Model(inputs, outputs)
        model.compile(optimizer="sgd", loss="mse")
        before = _state(model)
        with pytest.raises(FloatingPointError, match="no bfloat16"):
            kmp.diagnose(
                model,
                (np.ones((4, 16), "float32"), np.zeros((4, 10), "float32")),
                policy="mixed_bfloat16",
                verbose=False,
            )
        after = _state(model)
        _assert_unchanged(before, after)

    def test_data_forms(self):
        model = _mlp()
        x, y = _classification(48)

        def generator():
            for i in range(0, 48, 16):
                yield x[i : i + 16], y[i : i + 16]

        class Batches(keras.utils.PyDataset):
            def __len__(self):
                return 3

            def __getitem__(self, i):
                return x[16 * i : 16 * (i + 1)], y[16 * i : 16 * (i + 1)]

        reports = [
            kmp.diagnose(model, data, batches=3, batch_size=16, verbose=False)
            for data in ((x, y), generator(), Batches())
        ]
        try:
            import tensorflow as tf

            dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
            reports.append(
                kmp.diagnose(model, dataset, batches=3, verbose=False)
            )
        except ImportError:
            pass

        def measured(report):
            # Everything but when it was measured.
            record = json.loads(report.to_json())
            del record["environment"]["date"]
            return record

        first = measured(reports[0])
        for report in reports:
            assert report.examples == 48 and report.batches == 3
            assert measured(report) == first

    @parameterized.named_parameters(
        ("unbuilt", "unbuilt", {}, ValueError, "not built"),
        ("no_loss", "uncompiled", {}, ValueError, "needs a loss"),
        ("float32", "mlp", {"policy": "float32"}, ValueError, "mixed policy"),
        ("batches", "mlp", {"batches": 0}, ValueError, "`batches`"),
        ("scale", "mlp", {"loss_scale": -1.0}, ValueError, "`loss_scale`"),
        ("layer", "layer", {}, TypeError, "expects a keras.Model"),
    )
    def test_errors(self, which, kwargs, error, message):
        data = _classification()
        if which == "unbuilt":
            model = keras.Sequential([keras.layers.Dense(2)])
        elif which == "uncompiled":
            model = keras.Sequential(
                [keras.Input((16,)), keras.layers.Dense(2)]
            )
        elif which == "layer":
            model = keras.layers.Dense(2)
        else:
            model = _mlp()
        with pytest.raises(error, match=message):
            kmp.diagnose(model, data, verbose=False, **kwargs)

    def test_bad_data(self):
        with pytest.raises(ValueError, match="must be \\(x, y\\) arrays"):
            kmp.diagnose(_mlp(), 3, verbose=False)
        with pytest.raises(ValueError, match="Each batch must be"):
            kmp.diagnose(_mlp(), [np.zeros((2, 16))], verbose=False)
        with pytest.raises(ValueError, match="no batches"):
            kmp.diagnose(_mlp(), iter([]), verbose=False)
