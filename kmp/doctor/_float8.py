"""2b. Float8 layers: each operand's amax against its delayed scale.

A float8 layer (Keras's, which `kmp.float8` puts in, or kmp's own)
quantizes its inputs and kernel to E4M3 with a scale set by the largest
magnitude of recent steps (its amax history). Here every batch runs once
more through the model, in inference, and for each float8 layer and
operand this stage records:

    headroom   log2(scale's amax / this batch's amax): powers of two to
               spare; negative when the batch exceeds what the scale
               covers, and then the excess saturates
    saturated  share of values beyond the scale's range (clipped to the
               largest E4M3 value)
    flushed    share of nonzero values below half E4M3's smallest
               subnormal at that scale (they become 0)

The output gradients are not measured here (they exist only in a
training step). A kmp layer that has not trained has an empty history
and scales by the batch itself, and the report says so; Keras's starts
at scale 1 (|x| up to 448) until its first training step.
"""

import math

import numpy as np
from keras import ops

from kmp.doctor._progress import Progress
from kmp.fp8 import float8_matmuls
from kmp.fp8 import observe_operands
from kmp.model_layers import nested_layers

# E4M3: largest value 448, smallest subnormal 2^-9.
_E4M3_MAX = 448.0
_E4M3_TINY = 2.0**-9


def measure(model, batches, progress=None) -> list:
    """One dict per float8 layer operand (see the module docstring),
    over all `batches` (`(x, y)` pairs); `[]` without float8 layers.
    `progress` (the doctor's `Progress`; default: a quiet one) says the
    run through them."""
    layers = float8_matmuls(nested_layers(model))
    if not layers:
        return []
    progress = progress or Progress(verbose=False)
    index = {id(layer): i for i, layer in enumerate(layers)}
    seen = {}  # (layer index, operand) -> running statistics

    def record(layer, operand, x, limit):
        values = np.abs(ops.convert_to_numpy(ops.cast(x, "float32")))
        past = limit or 0.0
        stats = seen.setdefault(
            (index[id(layer)], operand),
            {"values": 0, "saturated": 0, "flushed": 0, "amax": 0.0},
        )
        current = float(values.max()) if values.size else 0.0
        limit = past if past > 0 else current
        nonzero = values[values > 0]
        stats["values"] += int(values.size)
        stats["saturated"] += int((values > limit).sum())
        floor = limit / _E4M3_MAX * _E4M3_TINY / 2
        stats["flushed"] += int((nonzero < floor).sum())
        stats["amax"] = max(stats["amax"], current)
        stats["history_amax"] = past

    with progress.step(f"float8 operands of {len(layers)} layer(s)"):
        with observe_operands(layers, record):
            for x, _ in batches:
                model(x, training=False)
    return [
        _row(layers[index], name, stats)
        for (index, name), stats in sorted(seen.items())
    ]


def _row(layer, operand, stats):
    past, amax = stats["history_amax"], stats["amax"]
    count = max(stats["values"], 1)
    headroom = math.log2(past / amax) if past > 0 and amax > 0 else None
    return {
        "path": layer.path or layer.name,
        "operand": operand,
        "amax": amax,
        "history_amax": past,
        "headroom": headroom,
        "saturated": stats["saturated"] / count,
        "flushed": stats["flushed"] / count,
    }


def describe(row) -> str:
    """One line for the report."""
    where = f"float8 {row['path']} {row['operand']}"
    if row["headroom"] is None:
        scale = "empty amax history (not trained yet): scaled by each batch"
    else:
        scale = f"headroom {row['headroom']:+.1f} bits"
    return (
        f"{where}: {scale}, {100 * row['saturated']:.2f}% saturated, "
        f"{100 * row['flushed']:.2f}% flushed to 0"
    )


def verdicts(rows, threshold=0.001) -> list:
    """Sentences for operands that saturate more than `threshold`."""
    return [
        f"float8 {row['path']} saturates {100 * row['saturated']:.2f}% of "
        f"its {row['operand']}: its amax history lags the data; give it a "
        "longer amax_history_length, or leave it out "
        f'(kmp.float8(model, skip=[r"{row["path"]}"]))'
        for row in rows
        if row["saturated"] > threshold
    ]
