"""A call set on one layer that runs on the layer running it
(`kmp.backend.layer_calls`): a closure, and under NNX a graph node that
NNX's transforms copy with the model (nnx_runs.py's block)."""

import inspect

import keras
import numpy as np
from util import nnx_only
from util import run_under_nnx

from kmp import backend


def _scaled(layer, scale, inputs):
    return type(layer).call(layer, inputs) * scale


def test_the_call_runs_its_function_on_the_layer_with_what_it_holds():
    layer = keras.layers.Dense(2, kernel_initializer="ones")
    layer.build((1, 3))
    layer.call = backend.layer_call(layer, _scaled, 2.0)
    layer.call._kmp_mark = True
    out = layer(np.ones((1, 3), "float32"))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), [[6.0, 6.0]])
    # Over it, with its mark and the layer's signature.
    layer.call = backend.layer_call(layer, _scaled, 0.5)
    assert layer.call._kmp_mark
    assert "inputs" in inspect.signature(layer.call).parameters


@nnx_only
def test_wrapped_layers_train_under_nnx_transforms(tmp_path_factory):
    # A pinned attention's projections (`flatten_bias`) and a GELU Dense
    # (`recompute_gelu`): their calls closed over the layer, so the copy
    # nnx.grad runs ran the original (the GELU's, mutating it across
    # traces, raised Flax's TraceContextError).
    result = run_under_nnx("block", tmp_path_factory)
    # One wrapper over another: the einsum's GELU over its flat bias.
    assert result["wrapped"] == {
        "attention/key": ["_kmp_flattens_bias"],
        "attention/query": ["_kmp_flattens_bias"],
        "attention/value": ["_kmp_flattens_bias"],
        "gelu": ["_kmp_recomputes_gelu"],
        "gelu_einsum": ["_kmp_flattens_bias", "_kmp_recomputes_gelu"],
    }
    kernels = {k: v for k, v in result["moved"].items() if "kernel" in k}
    assert len(kernels) == 7 and min(kernels.values()) > 1e-3
