"""kmp on models it did not write: keras.applications and KerasHub.

Each model is built from a small config (no download, `weights=None`, no
preset) and goes through what a user does: `kmp.enable` ->
`pin_float32` -> `audit` -> `compile(kmp.wrap(...))` + `fit` with
`LossScaleMonitor` -> `diagnose` -> `.keras` round trip (`kmp audit PATH`
agreeing with `kmp.audit`) -> under `mixed_bfloat16`, `kmp.float8` +
`fit` + round trip. Slow: about a minute per backend for the matrix.
"""

import json
import re
import warnings

import keras
import keras_hub  # the test extra pins it: missing is an error
import numpy as np
import pytest
from util import loss_and_gradients
from util import random_weights
from util import small_gpt2_backbone

import kmp
import kmp_cli
from kmp.model_layers import all_layers

pytestmark = pytest.mark.slow

RNG = np.random.default_rng(0)
IMAGES = RNG.uniform(0, 255, (4, 32, 32, 3)).astype("float32")
LABELS = RNG.integers(0, 10, (4,))
TOKENS = RNG.integers(1, 64, (4, 16)).astype("int32")
MASK = np.ones((4, 16), bool)


def _application(name):
    def build():
        return getattr(keras.applications, name)(
            weights=None, input_shape=(32, 32, 3), classes=10
        )

    return build, IMAGES, LABELS, "sparse_categorical_crossentropy"


def _bert():
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=64,
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=16,
    )
    return keras_hub.models.BertTextClassifier(
        backbone, num_classes=3, preprocessor=None
    )


def _gpt2():
    backbone = small_gpt2_backbone()
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)


def _llama_with_a_head():
    # A backbone under a Functional head of the user's.
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=64,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
    )
    ids = keras.Input((16,), dtype="int32", name="token_ids")
    mask = keras.Input((16,), dtype="int32", name="padding_mask")
    x = backbone({"token_ids": ids, "padding_mask": mask})
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(3, name="head")(x)
    return keras.Model({"token_ids": ids, "padding_mask": mask}, outputs)


def _vit():
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(32, 32, 3),
        patch_size=8,
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        mlp_dim=64,
    )
    return keras_hub.models.ViTImageClassifier(
        backbone, num_classes=10, preprocessor=None
    )


TEXT = {"token_ids": TOKENS, "padding_mask": MASK}
BERT_TEXT = {**TEXT, "segment_ids": np.zeros_like(TOKENS)}
CROSSENTROPY = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
APPLICATIONS = [
    "ResNet50V2",
    "MobileNetV3Small",
    "EfficientNetV2B0",
    "ConvNeXtTiny",
    "DenseNet121",
]
MODELS = {
    **{name: _application(name) for name in APPLICATIONS},
    "BertTextClassifier": (_bert, BERT_TEXT, LABELS % 3, CROSSENTROPY),
    "GPT2CausalLM": (_gpt2, TEXT, TOKENS, CROSSENTROPY),
    "LlamaBackbone+head": (
        _llama_with_a_head,
        {"token_ids": TOKENS, "padding_mask": MASK.astype("int32")},
        LABELS % 3,
        CROSSENTROPY,
    ),
    "ViTImageClassifier": (_vit, IMAGES, LABELS, CROSSENTROPY),
}
# KerasHub's.
TRANSFORMERS = [name for name in MODELS if name not in APPLICATIONS]
# Models with Dense or EinsumDense layers that kmp.float8 converts:
# the transformers, and ConvNeXt, whose pointwise convolutions are Dense.
MATMULS = [
    "ConvNeXtTiny",
    "BertTextClassifier",
    "GPT2CausalLM",
    "LlamaBackbone+head",
    "ViTImageClassifier",
]


# Models whose attention takes Keras's fused path (no dropout), which on
# JAX is a float16 x float16 -> float32 dot that JAX's CPU backend lacks.
FUSED_ATTENTION = ["LlamaBackbone+head", "ViTImageClassifier"]


# Every CNN trains, saves and loads on torch (eager: seconds each); on
# TensorFlow MobileNetV3Small stands for them (its eager CNN steps took
# 15-43 s each here: ConvNeXtTiny 43 s, ResNet50V2 37 s, DenseNet121
# 24 s, EfficientNetV2B0 15 s; CI's 20 minutes). On JAX none: XLA
# compiles each of a 100-layer CNN's fit, diagnose and predict programs
# for 20-80 s here (ResNet50V2's test took 260 s in a slow spell's run of
# the JAX suite's whole jobs, MobileNetV3Small's 509 s alone while other
# runs loaded the machine), the largest test of the JAX suite. What this
# test adds for a CNN does not depend on the backend (pinning and auditing
# layers kmp did not write, the `.keras` round trip, `kmp audit PATH`):
# TensorFlow and torch prove it.
# A CNN's JAX path (convolutions and BatchNormalization in JAX's stateless
# train step under kmp's scaler, saving and loading) is the CIFAR-10
# example's ResNet-9 (tests/examples/cifar10_test.py), and the zoo's
# transformers run here on JAX.
CNNS_ON_TENSORFLOW = ["MobileNetV3Small"]
# KerasHub's transformers on TensorFlow, which traces each one's steps
# (10-13 s a test here): a task (GPT-2) and a backbone under a head of
# the user's (Llama). Bert runs on JAX and torch, ViT on torch (and its
# float8 on JAX: JAX's CPU lacks its fused float16 attention, below); on
# TensorFlow the two took 48 s of CI's 20 minutes and tested no other
# TensorFlow code.
TRANSFORMERS_ON_TENSORFLOW = ["GPT2CausalLM", "LlamaBackbone+head"]


def _backends(name, policy):
    """Skips what cannot run here, or not inside CI's time."""
    tensorflow = keras.backend.backend() == "tensorflow"
    if tensorflow and name in APPLICATIONS and policy == "mixed_float16":
        if name not in CNNS_ON_TENSORFLOW:
            pytest.skip(f"CNNs on TensorFlow: {CNNS_ON_TENSORFLOW} (time)")
    hub_elsewhere = name not in TRANSFORMERS_ON_TENSORFLOW
    if tensorflow and name in TRANSFORMERS and hub_elsewhere:
        pytest.skip(f"transformers on TensorFlow: {TRANSFORMERS_ON_TENSORFLOW}")
    if tensorflow and policy == "mixed_bfloat16" and name == "ConvNeXtTiny":
        # Keras's float8 cannot train eagerly on TensorFlow, and tracing
        # ConvNeXt's step takes 25 s here: torch trains its float8.
        pytest.skip("ConvNeXt's float8 fit: torch (TF traces it for 25 s)")
    if keras.backend.backend() != "jax":
        return
    if name in APPLICATIONS and (
        policy == "mixed_float16" or name != "ResNet50V2"
    ):
        # (kmp.float8's verdict on a CNN compiles nothing: ResNet50V2's.)
        pytest.skip("CNNs on JAX: TensorFlow and torch (compile time)")
    import jax

    cpu = jax.devices()[0].platform == "cpu"
    if cpu and policy == "mixed_float16" and name in FUSED_ATTENTION:
        pytest.skip(
            "JAX's CPU dot_general has no F16_F16_F32 precision, which "
            "Keras's fused float16 attention asks for (a GPU has it)"
        )


def _unpinned(report):
    """Where the audit says a softmax, sigmoid or output is not float32."""
    return sorted(
        f.where
        for f in report
        if "not float32" in f.problem
        or re.search(r"computes in b?float16", f.problem)
    )


def _fit(model, x, y, loss, eager):
    # TensorFlow traces a 100-layer CNN's step for 20-35 s here: the
    # applications run their two steps eagerly on it.
    eager = eager and keras.backend.backend() == "tensorflow"
    model.compile(optimizer=kmp.wrap("adam"), loss=loss, run_eagerly=eager)
    monitor = kmp.callbacks.LossScaleMonitor()
    history = model.fit(
        x,
        y,
        batch_size=2,
        epochs=1,
        steps_per_epoch=2,
        verbose=0,
        callbacks=[monitor],
    )
    return history.history["loss"]


def _round_trip(model, x, tmp_path, name):
    """Saves `model`; returns the file and `kmp.load_model`'s model, whose
    predictions equal the saved model's."""
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    loaded = kmp.load_model(path)
    np.testing.assert_allclose(
        np.asarray(loaded.predict(x, verbose=0), "float32"),
        np.asarray(model.predict(x, verbose=0), "float32"),
        atol=1e-6,
    )
    return path, loaded


def _cli_audit(path, capsys):
    capsys.readouterr()
    kmp_cli.main(["audit", path, "--json"])
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_model_from_the_zoo_trains_saves_and_loads(name, tmp_path, capsys):
    _backends(name, "mixed_float16")
    build, x, y, loss = MODELS[name]
    kmp.enable("mixed_float16")
    keras.utils.set_random_seed(0)
    model = kmp.pin_float32(build())
    report = kmp.audit(model, verbose=False)
    assert not [f for f in report if f.severity == "error"], report
    assert _unpinned(report) == [], report
    losses = _fit(model, x, y, loss, eager=name in APPLICATIONS)
    assert np.all(np.isfinite(losses)), losses
    assert isinstance(model.optimizer, kmp.LossScaleOptimizer)
    diagnosis = kmp.diagnose(model, (x, y), batches=1, verbose=False)
    assert diagnosis is not None

    # kmp.load_model: islands, scaler and its state as they were.
    path, loaded = _round_trip(model, x, tmp_path, name)
    assert _unpinned(kmp.audit(loaded, verbose=False)) == []
    assert isinstance(loaded.optimizer, kmp.LossScaleOptimizer)
    for name_ in ("iterations", "dynamic_scale"):
        assert float(getattr(loaded.optimizer, name_)) == float(
            getattr(model.optimizer, name_)
        )
    # `kmp audit PATH` audits the file as kmp.load_model restores it
    # under its saved policy, without pinning again: it reports every
    # softmax pin the file loses (inside attention layers that other
    # layers make: KerasHub's), and not the missing scaler of Keras's
    # own load, which skips a KerasHub task's compile.
    as_filed = kmp.load_model(path, policy="saved", pin=False)
    filed = kmp.audit(as_filed, verbose=False)
    cli = _cli_audit(path, capsys)
    assert sorted((f["severity"], f["where"]) for f in cli) == sorted(
        (f.severity, f.where) for f in filed
    )
    assert not [f for f in filed if f.severity == "error"], filed
    lost = [f for f in filed if f.where in _unpinned(filed)]
    assert all(f.problem.startswith("Attention softmax") for f in lost), lost


@pytest.mark.parametrize("name", list(MODELS))
def test_float8_converts_what_pays_and_survives_a_load(name, tmp_path):
    _backends(name, "mixed_bfloat16")
    build, x, y, loss = MODELS[name]
    kmp.enable("mixed_bfloat16")
    keras.utils.set_random_seed(0)
    model = kmp.pin_float32(build())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kmp.float8(model)
    messages = [str(w.message) for w in caught if "kmp.float8" in str(w)]
    converted = _float8_paths(model)
    if name not in MATMULS:
        # A CNN: one true sentence, and nothing converted.
        assert converted == [] and len(messages) == 1
        assert "convolutions stay in the compute dtype" in messages[0]
        return
    assert converted and not messages, messages
    # (Keras's float8 layers cannot train in eager TensorFlow: graph mode.)
    losses = _fit(model, x, y, loss, eager=False)
    assert np.all(np.isfinite(losses)), losses
    path, loaded = _round_trip(model, x, tmp_path, name)
    assert _float8_paths(loaded) == converted
    # Keras's own load keeps them too.
    assert _float8_paths(keras.saving.load_model(path)) == converted


def _float8_paths(model):
    return sorted(
        layer.path
        for layer in model._flatten_layers(include_self=False)
        if getattr(layer, "quantization_mode", None) == "float8"
    )


# A CNN with BatchNormalization and the three KerasHub transformers on
# torch (seconds); on TensorFlow and JAX, which trace or compile each
# model's steps (on TensorFlow here: Bert and ViT 22 s each, MobileNet
# and Llama 10 s), Llama stands for them.
MEMORY_MODES = [
    "MobileNetV3Small",
    "BertTextClassifier",
    "LlamaBackbone+head",
    "ViTImageClassifier",
]
MEMORY_MODES_TRACED = ["LlamaBackbone+head"]


@pytest.mark.parametrize("name", MEMORY_MODES)
def test_bfloat16_masters_and_state_train_save_and_load(name, tmp_path):
    if keras.backend.backend() != "torch" and name not in MEMORY_MODES_TRACED:
        pytest.skip(f"traced backends: {MEMORY_MODES_TRACED} (time)")
    _backends(name, "mixed_bfloat16")
    build, x, y, loss = MODELS[name]
    kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    keras.utils.set_random_seed(0)
    model = kmp.pin_float32(build())
    losses = _fit(model, x, y, loss, eager=name in APPLICATIONS)
    assert np.all(np.isfinite(losses)), losses
    # Every weight and slot in bfloat16 (float32 islands compute in
    # float32 over bfloat16 variables), rounded stochastically.
    optimizer = model.optimizer
    assert {str(w.dtype) for w in model.trainable_weights} == {"bfloat16"}
    slots = [v for v in optimizer.variables if len(v.shape)]
    assert {str(v.dtype) for v in slots} == {"bfloat16"}
    assert kmp.memory.rounding_of(optimizer) == "stochastic"
    report = kmp.audit(model, verbose=False)
    assert any("by stochastic rounding" in f.problem for f in report), report
    assert _unpinned(report) == [], report

    path, loaded = _round_trip(model, x, tmp_path, name)
    assert type(loaded.optimizer) is type(optimizer)
    assert kmp.memory.rounding_of(loaded.optimizer) == "stochastic"
    assert int(loaded.optimizer.iterations) == 2
    for a, b in zip(optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(keras.ops.cast(a, "float32")),
            keras.ops.convert_to_numpy(keras.ops.cast(b, "float32")),
        )
    resumed = loaded.fit(x, y, batch_size=2, epochs=1, steps_per_epoch=1)
    assert np.isfinite(resumed.history["loss"][0])
    assert int(loaded.optimizer.iterations) == 3


# KerasHub backbones whose layers `kmp.pin_float32` changes on JAX for a
# GPU's sake (`kmp.islands`: position embeddings broadcast once, GELUs
# recomputed in the backward pass, attention projections' biases added
# flat, decoders' masks told causal), each from a small config with one
# layer (an encoder-decoder's one of each), and how many layers of each
# kind pinning changes. Each reaches them through code of its own: an
# encoder-decoder with cross-attention (Bart), one on audio features
# whose key projections have no bias and whose decoder is a subclass of
# KerasHub's (Whisper), layers shared by a group
# and a factorized embedding (ALBERT), attention with ALiBi and no
# position table (Bloom), disentangled attention (DeBERTa-v3), Fourier
# mixing and no attention (FNet), rotary attention whose query, key and
# value are one projection (GPT-NeoX), a decoder whose attention adds
# ALiBi to the scores it computes and whose feed-forward's GELU is a
# Dense's (Falcon). `benchmarks/keras_hub_islands.py`
# counts the four in 42 backbones: T5, XLNet and five more have none of
# them, the Llama family (Mixtral's included) and Gemma only their
# decoders' causal mask (whose values `tests/islands/hub_attention_test.py`
# checks for each).
SMALL = {"vocabulary_size": 64, "hidden_dim": 32, "intermediate_dim": 64}
ISLAND_BACKBONES = {
    # (config, (position embeddings, GELUs, flattened biases, decoders))
    "BartBackbone": (
        {**SMALL, "num_layers": 1, "num_heads": 2, "max_sequence_length": 16},
        (2, 2, 9, 1),
    ),
    "WhisperBackbone": (
        {
            **SMALL,
            "num_layers": 1,
            "num_heads": 2,
            "max_encoder_sequence_length": 16,
            "max_decoder_sequence_length": 16,
        },
        (2, 2, 6, 1),
    ),
    "AlbertBackbone": (
        {
            **SMALL,
            "num_layers": 1,
            "num_heads": 2,
            "embedding_dim": 16,
            "max_sequence_length": 16,
        },
        (1, 1, 3, 0),
    ),
    "BloomBackbone": ({**SMALL, "num_layers": 1, "num_heads": 2}, (0, 0, 3, 0)),
    "DebertaV3Backbone": (
        {**SMALL, "num_layers": 1, "num_heads": 2, "max_sequence_length": 16},
        (0, 1, 3, 0),
    ),
    "FNetBackbone": (
        {**SMALL, "num_layers": 1, "max_sequence_length": 16},
        (1, 1, 0, 0),
    ),
    "GPTNeoXBackbone": (
        {**SMALL, "num_layers": 1, "num_heads": 2, "max_sequence_length": 16},
        (0, 1, 1, 1),
    ),
    "FalconBackbone": (
        {**SMALL, "num_layers": 1, "num_attention_heads": 2},
        (0, 1, 3, 0),
    ),
}


def _backbone_inputs(backbone, batch=2, length=8):
    """Random inputs for each of a backbone's inputs: token ids, segment
    ids 0 and 1, masks on but for the second example's second half
    (padding), features (Whisper's audio) normal."""
    rng = np.random.default_rng(0)
    x = {}
    for tensor in backbone.inputs:
        name = tensor.name
        shape = [batch] + [d or length for d in tensor.shape[1:]]
        if "mask" in name:
            x[name] = np.ones(shape, tensor.dtype)
            x[name][1, length // 2 :] = 0
        elif "int" in tensor.dtype:
            high = 2 if "segment" in name else 64
            x[name] = rng.integers(0, high, shape).astype(tensor.dtype)
        else:
            x[name] = rng.normal(size=shape).astype(tensor.dtype)
    return x


def _islands(backbone):
    """How many layers repeat a position embedding, recompute a GELU,
    add a bias flat and tell their self-attention its mask is causal, and
    those layers."""
    layers = all_layers(backbone)
    kinds = [
        kmp.islands.broadcasts_once,
        kmp.islands.recomputes_gelu,
        kmp.islands.flattens_bias,
        kmp.islands.attends_causally,
    ]
    counts = tuple(sum(map(kind, layers)) for kind in kinds)
    return counts, [y for y in layers if any(kind(y) for kind in kinds)]


@pytest.mark.parametrize("name", list(ISLAND_BACKBONES))
def test_keras_hub_backbones_keep_their_values_under_jax_s_islands(name):
    if keras.backend.backend() != "jax":
        pytest.skip("pin_float32 changes these layers' calls on JAX only")
    config, counts = ISLAND_BACKBONES[name]
    kmp.enable("mixed_bfloat16")
    keras.utils.set_random_seed(0)
    backbone = getattr(keras_hub.models, name)(**config)
    x = _backbone_inputs(backbone)
    random_weights(backbone)  # not as initialized
    kmp.pin_float32(backbone)
    got_counts, changed = _islands(backbone)
    assert got_counts == counts
    # In float32 from here: the islands' arithmetic against Keras's and
    # KerasHub's own calls, to float32 rounding (in 16 bits each island's
    # own tests bound them).
    for layer in all_layers(backbone):
        layer.dtype_policy = "float32"
    got = loss_and_gradients(backbone, x)
    for layer in changed:
        del layer.call  # each island is the layer's own `call`
    assert _islands(backbone)[0] == (0, 0, 0, 0)
    want = loss_and_gradients(backbone, x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    # To the largest gradient: some are rounding alone (a key
    # projection's bias does not change a softmax, so its gradient is 0
    # but for rounding, about 1e-8 of the largest).
    largest = max(np.abs(g).max() for g in want[1:])
    for a, b in zip(got[1:], want[1:]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * largest)
