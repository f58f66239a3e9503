"""The audit's checks of the Keras layers that read raw values: a
`Normalization` left in 16 bits (under Keras's mixed_float16 a feature
whose variance is over 65504 comes out 0), one whose statistics an
adapt in 16 bits made infinite, and one whose statistics are stored in
bfloat16; a `Rescaling` of raw values left in 16 bits (it casts its
input first: a 16-bit image's 65535 is infinite in float16); an
`STFTSpectrogram` under bfloat16, which it refuses. `kmp.pin_float32`
makes them float32, and a kmp policy a
`Normalization` (`kmp.islands.feature_normalization`).

Like every `check_*` function of `kmp.auditing`, it reads the layers and
runs nothing, and appends `(severity, where, problem, fix)` tuples to
`findings`, as in `model_checks`.
"""

import keras
import numpy as np

from kmp.auditing.model_checks import _path
from kmp.islands import input_dtypes
from kmp.islands import is_bfloat16_spectrogram
from kmp.islands import is_feature_normalization
from kmp.islands import is_rescaling
from kmp.islands import largest_statistic
from kmp.islands import reads_raw_values
from kmp_config.names import HALF_DTYPES


def _stored_in(layer):
    """The dtype of an adapted layer's statistics' variables, or None."""
    if not layer.built or layer.input_mean is not None:
        return None
    return keras.backend.standardize_dtype(layer.adapt_mean.dtype)


def check_feature_normalizations(layers, findings):
    """Keras `Normalization` layers left in 16 bits (`kmp.pin_float32`
    and a kmp policy make them float32:
    `kmp.islands.feature_normalization`), and ones whose statistics an
    adapt in 16 bits made infinite."""
    for layer in layers:
        if not is_feature_normalization(layer):
            continue
        dtype = layer.compute_dtype
        largest = largest_statistic(layer)
        stored = _stored_in(layer)
        limit = float(np.finfo(dtype).max) if dtype == "float16" else None
        if largest is not None and not np.isfinite(largest):
            findings.append(
                (
                    "error",
                    _path(layer),
                    "Normalization's statistics are not finite (an adapt "
                    "in 16 bits, outside kmp's policy: Keras's reads each "
                    "batch in the layer's compute dtype): its features "
                    "come out 0 or NaN.",
                    "Adapt it again under kmp.enable(...), or build it "
                    "with dtype='float32' and adapt it.",
                )
            )
        elif largest is not None and limit is not None and largest > limit:
            findings.append(
                (
                    "error",
                    _path(layer),
                    f"Normalization computes in {dtype}, and its "
                    f"statistics reach {largest:.4g}, over {dtype}'s "
                    f"largest value ({limit:.0f}): a feature with such a "
                    "variance or mean comes out wrong (0, inf or NaN).",
                    "kmp.pin_float32(model).",
                )
            )
        elif stored in HALF_DTYPES:
            findings.append(
                (
                    "warning",
                    _path(layer),
                    "Normalization's statistics are stored in "
                    f"{stored} (a layer built before kmp's "
                    "policy, under bfloat16 master weights): its mean "
                    "keeps 8 significant bits of a raw feature.",
                    "Make the layer under kmp.enable(...) and adapt it "
                    "again, or make it with dtype='float32'.",
                )
            )
        elif dtype in HALF_DTYPES:
            bits = 11 if dtype == "float16" else 8
            findings.append(
                (
                    "warning",
                    _path(layer),
                    f"Normalization computes in {dtype}: it rounds raw "
                    "values (its input; its output with invert=True) and "
                    f"its mean to {bits} significant bits, and a variance "
                    "over 65504 is infinite in float16.",
                    "kmp.pin_float32(model).",
                )
            )


def check_rescalings(layers, findings):
    """Keras `Rescaling` layers of raw values left in 16 bits
    (`kmp.pin_float32` makes them float32): a warning for integers wider
    than 8 bits (a 16-bit image), whose range is known; an info for
    floats, whose values the graph does not say."""
    for layer in layers:
        dtype = layer.compute_dtype
        if not is_rescaling(layer) or dtype not in HALF_DTYPES:
            continue
        if not reads_raw_values(layer):
            continue
        read = sorted(input_dtypes(layer))
        floats = all("float" in name for name in read)
        if dtype == "float16":
            harm = (
                "a raw value of 65520 or more (a 16-bit image's 65535) is "
                "infinite, and the loss NaN"
            )
        else:
            harm = "a raw value keeps 8 significant bits (an 8-bit image's)"
        given = f" (its input is {', '.join(read)})" if read else ""
        findings.append(
            (
                "info" if read and floats else "warning",
                _path(layer),
                f"Rescaling casts its input to {dtype} before it scales "
                f"it{given}: {harm}.",
                "kmp.pin_float32(model).",
            )
        )


def check_spectrograms(layers, findings):
    """Keras `STFTSpectrogram` layers under bfloat16, which they refuse
    (`kmp.pin_float32` makes them float32)."""
    for layer in layers:
        if is_bfloat16_spectrogram(layer):
            findings.append(
                (
                    "error",
                    _path(layer),
                    "STFTSpectrogram computes in bfloat16, which it "
                    'refuses: its first call raises ("Invalid input '
                    'type. Expected float16, float32 or float64").',
                    "kmp.pin_float32(model), or dtype='float32' on it.",
                )
            )
