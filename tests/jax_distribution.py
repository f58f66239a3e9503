"""The examples under keras.distribution on 4 virtual CPU devices.

    python tests/jax_distribution.py data|model

Prints one JSON line (prefix RESULT). A helper for
tests/app/recipes_test.py: the device count must be set before JAX
initialises, so it runs in its own process.
"""

import dataclasses
import json
import os
import sys
import tempfile

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["KERAS_BACKEND"] = "jax"

import keras  # noqa: E402

import kmp  # noqa: E402
from kmp.examples import cifar10  # noqa: E402
from kmp.examples import imdb  # noqa: E402


def sharding(model, name):
    """Into how many distinct parts the first weight whose path contains
    `name` is split over the devices."""
    kernel = next(v for v in model.weights if name in v.path)
    shards = kernel.value.addressable_shards
    return len({tuple((s.start, s.stop) for s in x.index) for x in shards})


def main(name):
    out = tempfile.mkdtemp()
    results = {}
    imdb_config = imdb.Config(
        policy="mixed_bfloat16",
        data="synthetic",
        synthetic_size=64,
        epochs=1,
        steps=2,
        batch_size=8,
        d_model=16,
        heads=2,
        layers=1,
        sequence_length=16,
        vocabulary_size=64,
        distribution=name,
        output_dir=os.path.join(out, "imdb"),
        verbose=0,
    )
    imdb_results = imdb.train(imdb_config)
    model = keras.saving.load_model(os.path.join(out, "imdb", "imdb.keras"))
    results["imdb"] = {
        "losses": imdb_results["step_losses"],
        "replicas": imdb_results["replicas"],
        # Loaded under the distribution: its variables take the layout.
        "query_parts": sharding(model, "attention_0/query/kernel"),
        "ffn_up_parts": sharding(model, "ffn_up_0/kernel"),
        "ffn_down_parts": sharding(model, "ffn_down_0/kernel"),
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
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
