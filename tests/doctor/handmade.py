"""Doctor reports from hand-made counts, with no model run: for the tests
of the verdicts, the report and the view."""

import types

import numpy as np

from kmp.doctor._verdicts import judge
from kmp.doctor.numerics import FORMATS
from kmp.doctor.numerics import RangeCounter

KINDS = ("activations", "activation_gradients", "weight_gradients")


def _layer(path):
    return types.SimpleNamespace(path=path, name=path)


def diagnose_rows(
    rows,
    scale=2.0**15,
    policy="mixed_float16",
    grads=None,
    bounds=(1.0, 2.0**24),  # kmp's min_scale, max_scale
):
    """The `kmp.Diagnosis` of layers given as rows: (path, dtype,
    reference activations, mixed activations)."""
    fmt = FORMATS["float16" if policy == "mixed_float16" else "bfloat16"]
    layers = [_layer(path) for path, *_ in rows]
    counters = {
        kind: [
            RangeCounter(fmt, 1.0 if kind == "activations" else scale)
            for _ in range(len(rows) + 1)
        ]
        for kind in KINDS
    }
    for i, (_, _, reference, mixed) in enumerate(rows):
        counters["activations"][i].add(reference, mixed)
        g = np.full(4, 2.0**-10) if grads is None else grads
        counters["activation_gradients"][i].add(g, g * scale)
    counts = types.SimpleNamespace(
        counters=counters,
        dtypes={i: dtype for i, (_, dtype, *_) in enumerate(rows)},
    )
    return judge(
        model=types.SimpleNamespace(name="m"),
        layers=layers,
        counts=counts,
        policy=policy,
        scale=scale,
        batches=1,
        examples=4,
        notes=[],
        scale_bounds=bounds,
    )


def noisy(values, error):
    values = np.asarray(values, np.float32)
    return values, values * (1 + error)
