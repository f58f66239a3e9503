"""The preflight check: `kmp.audit(model)` and its findings.

    loss_checks         what reads the outputs: the compiled losses;
                        16-bit probabilities
    loss_flow           which held model's outputs a trainer's
                        crossentropies read, from its step's source
    held_outputs        which of a held model's outputs a step's value
                        carries: unpacked, or a constant subscript
    model_checks        outputs, inner softmaxes, tensor-core sizes, loss
    normalization_checks  Normalization layers in 16 bits, or with
                        statistics a 16-bit adapt made infinite
    source_reading      a model's own methods, read (not run): the
                        methods of `self` a step reaches
    optimizer_checks    loss scaling, an optimizer that is no Keras
                        one, the memory modes, a scaler saving would lose
    train_step_checks   a train step of the user's own: whether it
                        scales, and the loss each optimizer applies
    dtype_checks        the user's code against 16-bit dtypes: float
                        token ids, float32 random draws, `tf.concat`
    constant_checks     a constant in the user's layer code that float16
                        cannot hold (an additive mask's -1e9)
    softmax_checks      a softmax op in the user's 16-bit layer code,
                        Keras's Attention layers in 16 bits
    environment_checks  hardware, TF32, XLA, an active distribution
    float8_checks       float8 layers where they cannot be fast
    audit               `kmp.audit`, `kmp.Finding`, `kmp.AuditReport`

Imports from kmp: backend, errors, fp8, islands, memory, model_layers,
policy, scaling.
"""

from kmp.auditing.audit import AuditReport
from kmp.auditing.audit import Finding
from kmp.auditing.audit import audit

__all__ = ["AuditReport", "Finding", "audit"]
