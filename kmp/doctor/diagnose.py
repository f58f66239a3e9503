"""`kmp.diagnose(model, data)`: the numerics doctor's pipeline.

    inputs = _inputs.prepare(...)              # 1. check and resolve
    for each batch, with the layers tapped:
        reference, mixed = run(x, y)           # 2. _passes: two passes
        counts.add(reference, mixed)           # 3. _counts: count
    diagnosis = _verdicts.judge(counts, ...)   # 4. judge
    diagnosis.show()                           # 5. diagnosis -> _view

Each stage reads what the one before it produced and never calls back.
Where a tap cannot reach the layers nested inside a loop, the passes run
again observing the model's top-level layers only.
"""

import keras

from kmp import backend
from kmp.doctor import _float8
from kmp.doctor import _inputs
from kmp.doctor import _verdicts
from kmp.doctor._counts import LayerCounts
from kmp.doctor._passes import two_passes
from kmp.doctor._progress import Progress
from kmp.doctor._taps import LOOPING
from kmp.doctor._taps import observed_layers
from kmp.doctor.diagnosis import Diagnosis
from kmp.model_layers import all_layers
from kmp_config.names import HALF_DTYPES


def diagnose(
    model: keras.Model,
    data,
    loss=None,
    batches: int = 2,
    loss_scale: float | None = None,
    policy: str | None = None,
    batch_size: int = 32,
    jit_compile: bool | str = "auto",
    verbose: bool = True,
) -> Diagnosis:
    """Finds the layers that float16 (or bfloat16) hurts, and says why.

    Runs `batches` batches through `model` twice with the same weights:
    once in float32 (the reference), once under the mixed policy, with the
    loss multiplied by the loss scale. Per layer it measures the outputs
    (largest magnitude, the fractions that overflow, are lost below the
    smallest subnormal or are subnormal in the half format, the relative
    error against float32), the gradients by the outputs and by the
    weights (the same fractions without scaling and at the loss scale),
    and gives verdicts: layers to pin to float32, whether the loss scale
    is too low or too high with the range of scales that keeps 99 % of
    gradient values representable, or that no scale does
    (`mixed_bfloat16` then). The model, its weights, its optimizer and the
    global dtype policy are left as they were.

    Args:
        model: A built Keras model (Sequential, Functional or subclassed).
        data: `(x, y)` arrays, a `tf.data.Dataset`, a
            `keras.utils.PyDataset` or an iterable of `(x, y)` batches.
        loss: The loss as `compile` takes it (a name, function or
            `keras.losses.Loss` for all outputs, a list, or a dict by
            output name); default: the model's compiled loss. Loss
            weights, regularization terms and sample weights are not
            applied.
        batches: How many batches to run.
        loss_scale: The loss scale to test; default: the model's
            `LossScaleOptimizer`'s current scale, else 1.
        policy: The mixed policy to test: `"mixed_float16"` or
            `"mixed_bfloat16"`. Default: the model's own (half-precision
            layers as built, pinned ones float32); a float32 model is
            tested under `"mixed_float16"`. Given a policy, the model's
            half-precision layers switch to it; in a float32 model every
            layer does except outputs and softmax/sigmoid layers, which
            stay float32 as `kmp.pin_float32` would leave them.
        batch_size: Batch size when `data` is arrays.
        jit_compile: Compile both passes with XLA; `"auto"`: the model's
            own `jit_compile` (Keras: XLA, except TensorFlow on a CPU-only
            machine).
        verbose: Print a line as each stage starts (reading the
            batches, each batch's two passes, counting, the verdicts),
            with its seconds as it ends.

    Returns:
        A `kmp.Diagnosis`: `.show()`, `.summary()`, `.to_json()`,
        `.plot(path)`.

    Example:

    ```python
    kmp.enable("mixed_float16")
    model = build_model()
    model.compile(optimizer=kmp.wrap("adam"), loss="mse")
    report = kmp.diagnose(model, (x_train, y_train), batch_size=128)
    report.show()              # per-layer table, verdicts, summary
    report.plot("doctor.png")  # gradient magnitudes vs float16's range
    ```
    """
    progress = Progress(verbose)
    with progress.step(f"reading {batches} batch(es)"):
        inputs = _inputs.prepare(
            model,
            data,
            loss,
            batches,
            loss_scale,
            policy,
            batch_size,
            jit_compile,
        )
    layers, counts, notes = _observe(inputs, progress)
    float8 = _float8.measure(inputs.model, inputs.batches, progress)
    with progress.step("verdicts"):
        return _verdicts.judge(
            model=model,
            layers=layers,
            counts=counts,
            policy=inputs.policy,
            scale=inputs.scale,
            batches=len(inputs.batches),
            examples=sum(
                len(keras.tree.flatten(x)[0]) for x, _ in inputs.batches
            ),
            notes=notes + _coverage_notes(inputs, layers, counts),
            scale_bounds=inputs.scale_bounds,
            float8=float8,
        )


def _observe(inputs, progress):
    """`(layers, counts, notes)`: every batch run and counted, observing
    nested layers, or the model's top-level layers where that fails."""
    layers = observed_layers(inputs.model)
    top_level = observed_layers(inputs.model, nested=False)
    try:
        return layers, _count_batches(inputs, layers, progress), []
    except Exception as error:
        if len(top_level) == len(layers):
            raise
        # A layer may call its inner layers inside a loop or a traced
        # transformation (lax.scan, tf.while_loop in a graph, remat),
        # where a tap cannot reach: observe the model's own layers only.
        # If that fails too, the first error is the one to see.
        progress.say("observing the model's top-level layers only")
        try:
            counts = _count_batches(inputs, top_level, progress)
        except Exception:
            raise error from None
        first_line = (str(error).splitlines() or [""])[0][:120]
        return (
            top_level,
            counts,
            [
                "observing nested layers failed "
                f"({type(error).__name__}: {first_line}); only the "
                "model's top-level layers are observed"
            ],
        )


def _count_batches(inputs, layers, progress):
    """Runs both passes over every batch and counts them."""
    counts = LayerCounts(inputs, layers)
    total = len(inputs.batches)
    with two_passes(inputs, layers, progress) as run:
        for step, (x, y) in enumerate(inputs.batches):
            label = f"batch {step + 1}/{total}"
            reference, mixed = run(x, y, label)
            with progress.step(f"{label}: counting"):
                counts.add(reference, mixed)
    return counts


def _coverage_notes(inputs, layers, counts):
    """What the report could not see, or saw differently, said plainly."""
    model = inputs.model
    notes = [
        f"{layers[i].path or layers[i].name} computed in {dtype} in the "
        "float32 reference (its code fixes the dtype)"
        for i, dtype in sorted(counts.reference_dtypes.items())
        if dtype != "float32"
    ]
    if inputs.switched and not any(
        x.compute_dtype in HALF_DTYPES for x in all_layers(model)
    ):
        notes.append(
            f"float32 model: tested under {inputs.policy} with its outputs "
            "and softmax/sigmoid layers kept float32, as kmp.pin_float32 "
            "would"
        )
    stored = {backend.stored_dtype(v) for v in model.trainable_variables}
    half = sorted(stored & set(HALF_DTYPES))
    if half:
        notes.append(
            f"weights stored in {', '.join(half)} (master weights): the "
            "float32 reference reads the same rounded weights, as float32"
        )
    if not getattr(model, "outputs", None):
        notes.append(
            "subclassed model: outputs are observed at each layer; "
            "operations its call() runs between layers are not"
        )
    notes += [
        f"{layer.path or layer.name} ({type(layer).__name__}) runs its inner "
        "layers in a loop: observed as a whole"
        for layer in layers
        if isinstance(layer, LOOPING)
    ]
    return notes
