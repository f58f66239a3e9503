"""FLOPs counted per layer (`kmp.app.flops`), by hand on small layers."""

import keras
import pytest

from kmp.app import flops

pytestmark = pytest.mark.backend_independent


def _model(inputs, outputs):
    return keras.Model(inputs, outputs)


def test_dense_and_conv_count_two_flops_per_multiply_add():
    inputs = keras.Input((8,))
    dense = _model(inputs, keras.layers.Dense(4)(inputs))
    assert flops.forward_flops(dense) == 2 * 8 * 4
    images = keras.Input((32, 32, 3))
    conv = keras.layers.Conv2D(8, 3, padding="same")(images)
    pooled = keras.layers.MaxPooling2D()(conv)  # not counted
    assert flops.forward_flops(_model(images, pooled)) == (
        2 * (3 * 3 * 3) * 8 * 32 * 32
    )
    assert flops.training_flops(_model(images, pooled)) == (
        3 * 2 * 27 * 8 * 1024
    )


def test_attention_counts_projections_and_both_products():
    tokens = keras.Input((5, 8))
    mixed = keras.layers.MultiHeadAttention(2, key_dim=4)(tokens, tokens)
    projections = 3 * (2 * 8 * 8 * 5) + 2 * 8 * 8 * 5
    products = 2 * (2 * 2 * 5 * 5 * 4)
    assert flops.forward_flops(_model(tokens, mixed)) == (
        projections + products
    )


def test_the_resnet9_matches_its_published_count():
    from kmp.examples import cifar10

    # 2.28 GFLOP per training image (../shared/gpu-results/2026-11-22).
    per_image = flops.training_flops(cifar10.build_model(64))
    assert per_image == pytest.approx(2.28e9, rel=0.01)


def test_peaks_are_known_for_listed_gpus_only():
    assert flops.peak_tflops("NVIDIA H100 80GB HBM3", "mixed_bfloat16", True)
    assert flops.peak_tflops("NVIDIA H100", "float32", True) == 494.0
    assert flops.peak_tflops("NVIDIA H100", "float32", False) == 67.0
    assert flops.peak_tflops("AMD EPYC", "mixed_float16", None) is None
