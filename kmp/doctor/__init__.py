"""The numerics doctor: where float16 (or bfloat16) hurts a model, and why.

`kmp.diagnose(model, data)` runs a few batches through the model twice
with the same weights, in float32 and under the mixed policy at the loss
scale, observes every layer, and judges what it saw. One stage per
module, data flowing down this list; each module imports only the ones
above it (and the core), and only `diagnose` imports the stages:

    numerics     the half formats' ranges and the counters (vocabulary)
    _progress       a line as each stage starts, its seconds as it ends
    _inputs      1. check `diagnose`'s arguments -> `Inputs`
    _taps           taps on every layer's outputs; temporary policies
    _passes      2. per batch: float32 and mixed pass -> `PassResult`s
    _counts      3. count each pass's tensors per layer -> `LayerCounts`
    _float8     2b. float8 layers: each operand's amax vs its scale
    _view           tables and a PNG of per-layer reports (a renderer)
    diagnosis       the report, `kmp.Diagnosis`: data, JSON, show, plot
    _verdicts    4. judge the counts -> `kmp.Diagnosis`
    diagnose        the pipeline: 1 -> 2 -> 3 -> 4

(`tests/layout_test.py` checks this order against the imports.)

Imports from kmp: backend (gradients by intermediate tensors, the
machine), console, errors, fp8 (float8 layers' operands), islands (what
pinning keeps float32), model_layers, policy, scaling (the scale range).

BUILD_NOTES.md, "How kmp.diagnose works", has the design.
"""

from kmp.doctor.diagnose import diagnose
from kmp.doctor.diagnosis import Diagnosis

__all__ = ["Diagnosis", "diagnose"]
