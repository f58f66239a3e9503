"""A preflight check for mixed-precision training: `kmp.audit(model)`.

Each check (`model_checks`, `loss_checks`, `optimizer_checks`,
`train_step_checks`, `dtype_checks`, `softmax_checks`,
`environment_checks`, `float8_checks`) looks for one way float16 or
bfloat16 training silently goes wrong or slow, and says where and how to
fix it. The checks read the model's layers, policies, compiled loss and
optimizer, its class's source, and the machine; they run nothing on the
model.
"""

import dataclasses
import json

import keras

from kmp.auditing import constant_checks
from kmp.auditing import dtype_checks
from kmp.auditing import environment_checks
from kmp.auditing import float8_checks
from kmp.auditing import model_checks
from kmp.auditing import normalization_checks
from kmp.auditing import optimizer_checks
from kmp.auditing import softmax_checks
from kmp.auditing import train_step_checks
from kmp.errors import InputError
from kmp.model_layers import all_layers
from kmp.model_layers import output_layers

SEVERITIES = ("error", "warning", "info")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One audit finding.

    Attributes:
        severity: `"error"` (results are wrong), `"warning"` (results or
            speed are at risk) or `"info"`.
        where: The layer's path, `"model"`, or `"environment"`.
        problem: What is wrong.
        fix: How to fix it.
    """

    severity: str
    where: str
    problem: str
    fix: str


class AuditReport(list):
    """The findings of `kmp.audit`, most severe first."""

    def to_json(self) -> str:
        return json.dumps([dataclasses.asdict(f) for f in self], indent=2)

    def show(self) -> None:
        """Prints the findings as a table."""
        if not self:
            print("kmp.audit: no findings.")
            return
        width = min(max(len(f.where) for f in self), 40)
        print(f"{'severity':<8}  {'where':<{width}}  problem / fix")
        for f in self:
            print(f"{f.severity:<8}  {f.where:<{width}}  {f.problem}")
            print(f"{'':<8}  {'':<{width}}  fix: {f.fix}")


def audit(model, optimizer=None, verbose: bool = True) -> AuditReport:
    """Checks a model for mixed-precision hazards before training.

    Reports, with the layer path and a fix:

    - model outputs that are not float32, and float16 softmax or sigmoid
      outputs (crossentropy then loses its logits path); for a subclassed
      model with no `call` of its own, the outputs of the models it
      holds (a VAE's decoder);
    - softmaxes inside the model computing in half precision: layers,
      a softmax op in a layer of your own, and Keras's `Attention` and
      `AdditiveAttention`;
    - Keras `Normalization` and `Rescaling` layers in half precision
      (they read raw values), a `Normalization`'s statistics that are
      infinite or stored in bfloat16, and an `STFTSpectrogram` in
      bfloat16, which it refuses;
    - float16 compute while the optimizer does not scale the loss; the
      stock Keras scaler instead of kmp's; a scaler with nothing to scale;
      a scaler Keras added at compile time, which saving loses; a
      `train_step` of the model's own class under a loss scaler, with
      whether it scales its loss and what kmp does where it does not;
    - the memory modes: bfloat16 master weights (a warning when their
      updates round to nearest), 16-bit or float16 optimizer state, and
      rematerialized layers (a warning for `keras.RematScope` alone);
    - Dense, convolution, Embedding and MultiHeadAttention sizes that are
      not multiples of 8 (tensor cores), with the padded size;
    - `binary_crossentropy` on float16 sigmoid probabilities;
    - the environment: hardware where mixed precision is not faster, a
      float16 attention JAX's CPU cannot compile (an error), TF32 (on
      GPUs that have it), XLA (for mixed-precision models) and an active
      distribution;
    - float8 layers (`kmp.float8`) on hardware without float8 tensor
      cores, without XLA, or with sizes that are not multiples of 16.

    Args:
        model: A Keras model, built (recommended) or not.
        optimizer: The optimizer to check; defaults to `model.optimizer`
            for a compiled model.
        verbose: Print the findings as a table.

    Returns:
        An `AuditReport`: a list of `Finding`s, errors first, with
        `to_json()` and `show()`.

    Example:

    ```python
    model = kmp.pin_float32(build_model())
    model.compile(optimizer=kmp.wrap("adam"), loss="mse")
    kmp.audit(model)
    ```
    """
    if not isinstance(model, keras.layers.Layer):
        raise InputError(f"audit expects a Keras model, got {model!r}.")
    if optimizer is None:
        optimizer = getattr(model, "optimizer", None)
    elif isinstance(optimizer, str):  # as `compile` takes one: "adam"
        optimizer = keras.optimizers.get(optimizer)
    findings = []  # (severity, where, problem, fix)
    outputs = output_layers(model)  # None for subclassed models
    half = model_checks.half_layers(model)
    model_checks.check_outputs(model, outputs, findings)
    model_checks.check_inner_softmaxes(half, outputs, findings)
    layers = all_layers(model)
    normalization_checks.check_feature_normalizations(layers, findings)
    normalization_checks.check_rescalings(layers, findings)
    normalization_checks.check_spectrograms(layers, findings)
    applied = [("optimizer", optimizer)]
    if optimizer_checks.check_foreign(half, optimizer, findings):
        optimizer = None  # the model's own checks only
        applied = []
        optimizer_checks.check_memory(model, None, findings)
    elif optimizer is getattr(model, "optimizer", None):
        applied = train_step_checks.applied_optimizers(model, optimizer)
    for attribute, each in applied:
        optimizer_checks.check_scaling(half, each, findings, attribute)
        optimizer_checks.check_memory(model, each, findings)
    if ("optimizer", optimizer) in applied:
        optimizer_checks.check_saving(model, optimizer, findings)
    train_step_checks.check_train_step(model, optimizer, findings)
    dtype_checks.check_float_ids(model, findings)
    dtype_checks.check_random_draws(half, findings)
    constant_checks.check_large_constants(half, findings)
    softmax_checks.check_softmax_ops(half, findings)
    softmax_checks.check_attention_layers(half, findings)
    dtype_checks.check_step_joins(model, findings)
    model_checks.check_tensor_core_dims(half, findings)
    model_checks.check_loss(model, outputs, findings)
    environment_checks.check_environment(model, half, findings)
    float8_checks.check_float8(model, layers, findings)
    report = AuditReport(
        sorted(
            # Each once: the optimizers of a GAN may repeat a finding.
            (Finding(*finding) for finding in dict.fromkeys(findings)),
            key=lambda f: SEVERITIES.index(f.severity),
        )
    )
    if verbose:
        report.show()
    return report
