"""The examples under keras.distribution on 4 virtual CPU devices.

    python tests/jax_distribution.py data|model

Prints one JSON line (prefix RESULT). A helper for
tests/app/scale_out_test.py: the device count must be set before JAX
initialises, so it runs in its own process.
"""

import dataclasses
import json
import os
import sys
import tempfile

# Added to the suite's flags (conftest: a cheaper LLVM pipeline), not
# in their place.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=4"
).strip()
os.environ["KERAS_BACKEND"] = "jax"

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
from util import random_weights  # noqa: E402
from util import small_gpt2_backbone  # noqa: E402
from util import small_imdb_config  # noqa: E402

import kmp  # noqa: E402
from kmp.examples import cifar10  # noqa: E402
from kmp.examples import imdb  # noqa: E402
from kmp.model_layers import all_layers  # noqa: E402


def sharding(variables, name):
    """Into how many distinct parts the first of `variables` whose path
    contains `name` is split over the devices."""
    kernel = next(v for v in variables if name in v.path)
    shards = kernel.value.addressable_shards
    return len({tuple((s.start, s.stop) for s in x.index) for x in shards})


def main(name):
    out = tempfile.mkdtemp()
    results = {}
    imdb_config = small_imdb_config(
        policy="mixed_bfloat16",
        synthetic_size=64,
        distribution=name,
        # Split kernels, 8-bit slots: the codes take the kernel's layout.
        optimizer_states="int8" if name == "model" else "float32",
        output_dir=os.path.join(out, "imdb"),
    )
    imdb_results = imdb.train(imdb_config)
    model = keras.saving.load_model(os.path.join(out, "imdb", "imdb.keras"))
    results["imdb"] = {
        "losses": imdb_results["step_losses"],
        "replicas": imdb_results["replicas"],
        # Loaded under the distribution: its variables take the layout.
        "query_parts": sharding(model.weights, "attention_0/query/kernel"),
        "ffn_up_parts": sharding(model.weights, "ffn_up_0/kernel"),
        "ffn_down_parts": sharding(model.weights, "ffn_down_0/kernel"),
        # The loaded optimizer's 8-bit codes of ffn_up_0's slots, each's
        # dtype and parts (its bias's slots are under a block: float32;
        # none with float32 state).
        "ffn_up_codes": [
            [str(v.dtype), sharding([v], v.path)]
            for v in model.optimizer.variables
            if "ffn_up_0" in v.path and v.path.endswith("codes")
        ],
    }
    results["audit"] = [
        f.problem
        for f in kmp.audit(model, verbose=False)
        if "distribution is active" in f.problem
    ]
    keras.distribution.set_distribution(None)
    del model
    cifar_config = cifar10.Config(
        policy="mixed_float16",
        data="synthetic",
        synthetic_size=64,
        epochs=1,
        steps=2,
        batch_size=8,
        width=8,
        distribution=name,
        output_dir=os.path.join(out, "cifar10"),
        verbose=0,
    )
    cifar_results = cifar10.train(cifar_config)
    results["cifar10"] = {
        "losses": cifar_results["step_losses"],
        "replicas": cifar_results["replicas"],
        "loss_scale": cifar_results["loss_scale"],
    }
    keras.distribution.set_distribution(None)
    try:
        imdb.train(dataclasses.replace(imdb_config, batch_size=7))
    except kmp.InputError as error:
        results["batch_7"] = str(error)
    keras.distribution.set_distribution(None)
    if name == "model":
        results["parts"] = parts()
    print("RESULT " + json.dumps(results))


def _float8_mlp(matmul):
    """A pinned, compiled 16 -> 32 -> 32 -> 2 MLP under the current
    policy, `kmp.float8(model, matmul=matmul)` applied."""
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(32, name="first"),
            keras.layers.Dense(32, activation="relu", name="hidden"),
            keras.layers.Dense(2, name="head"),
        ]
    )
    model = kmp.float8(kmp.pin_float32(model), matmul=matmul)
    model.compile(
        optimizer=kmp.wrap(keras.optimizers.SGD(0.01)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _gpt2_islands(undo):
    """A pinned small GPT-2 under the current distribution and policy,
    fitted 2 epochs on 32 sequences (the batch from which its position
    embedding's island takes a product), with JAX's islands or with them
    undone: its losses, how many layers had an island, and into how many
    parts the first query kernel is split."""
    keras.utils.set_random_seed(0)
    model = keras_hub.models.GPT2CausalLM(
        small_gpt2_backbone(), preprocessor=None
    )
    random_weights(model)  # not as initialized
    kmp.pin_float32(model)
    changed = [layer for layer in all_layers(model) if "call" in vars(layer)]
    if undo:
        for layer in changed:
            del layer.call  # each island is the layer's own `call`
    model.compile(
        optimizer=kmp.wrap(keras.optimizers.Adam(1e-3)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    ids = np.random.default_rng(0).integers(0, 64, (32, 16)).astype("int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids, dtype=bool)}
    history = model.fit(
        x, np.roll(ids, -1, axis=1), batch_size=32, epochs=2, verbose=0
    )
    return {
        "losses": [float(v) for v in history.history["loss"]],
        "islands": len(changed),
        "query_parts": sharding(model.weights, "query/kernel"),
    }


def parts():
    """kmp's parts under a 2 x 2 ModelParallel mesh: float8 statistics,
    the doctor, the audit's layout checks, JAX's islands on a GPT-2 whose
    attention heads and feed-forward columns are split."""
    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh((2, 2), ["batch", "model"], devices)
    layout = keras.distribution.LayoutMap(mesh)
    layout[".*/hidden/kernel"] = (None, "model")  # Keras full-matches
    layout[".*/odd/kernel"] = (None, "model")  # 3 columns: no even split
    # GPT-2's query, key and value kernels (width, heads, head_dim) split
    # by heads, their biases alike, the feed-forward's first kernel by
    # columns (as KerasHub's layout maps split other backbones).
    layout[".*/self_attention/(query|key|value)/kernel"] = (None, "model", None)
    layout[".*/self_attention/(query|key|value)/bias"] = ("model", None)
    layout[".*/feedforward_intermediate_dense/kernel"] = (None, "model")
    # Built before the distribution is set: on one device, and (JAX would
    # refuse to build it under the distribution) its layout cannot divide.
    early = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(3, name="odd")]
    )
    distribution = keras.distribution.ModelParallel(
        layout_map=layout, batch_dim_name="batch"
    )
    keras.distribution.set_distribution(distribution)
    out = {}
    with kmp.policy_scope("mixed_bfloat16"):
        # Keras's float8 path, whose amax histories are read below (kmp's
        # matmul, the default on JAX, keeps none: the model after it).
        model = _float8_mlp(matmul="keras")
        x = np.random.default_rng(0).normal(size=(8, 16)).astype("float32")
        x[7, 3] = 100.0  # the largest input, in the last device's rows
        y = np.arange(8) % 2
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        histories = {}
        for variable in model.weights:
            if "amax_history" not in variable.path:
                continue
            shards = [
                np.asarray(s.data) for s in variable.value.addressable_shards
            ]
            histories[variable.path] = {
                "devices": len(shards),
                "identical": all(np.array_equal(shards[0], s) for s in shards),
                "largest": float(np.max(shards[0])),
            }
        out["float8_histories"] = histories
        out["hidden_parts"] = sharding(model.weights, "hidden/kernel")
        # The same model with kmp.float8's default matmul (kmp's own):
        # trains on the mesh, its hidden kernel still split.
        own = _float8_mlp(matmul=None)
        losses = own.fit(x, y, batch_size=8, epochs=2, verbose=0)
        out["kmp_matmul"] = {
            "class": type(own.get_layer("hidden")).__module__,
            "losses": [float(v) for v in losses.history["loss"]],
            "hidden_parts": sharding(own.weights, "hidden/kernel"),
        }
        diagnosis = kmp.diagnose(model, (x, y), verbose=0)
        out["diagnosed_layers"] = len(diagnosis.layers)
        out["gpt2"] = {
            "islands": _gpt2_islands(undo=False),
            "undone": _gpt2_islands(undo=True),
        }
    out["audit_sharded"] = [
        f.problem
        for f in kmp.audit(model, verbose=False)
        if "layout" in f.problem
    ]
    out["audit_early"] = [
        (f.where, f.problem)
        for f in kmp.audit(early, verbose=False)
        if "layout" in f.problem
    ]
    keras.distribution.set_distribution(None)
    return out


if __name__ == "__main__":
    main(sys.argv[1])
