"""The one place where kmp's code differs between Keras backends (and,
in `keras_internals`, between Keras versions).

Everything else in kmp is written against `keras.ops` and the public
Keras API; what cannot be branches here, each function once, on
`name()`. One module per concern:

    _current     which backend runs: `name`, `is_stateless`, `is_nnx`
    settings     process-wide: the persistent XLA cache, TF32
    initialization  new variables' values from one compiled program (JAX)
    machine      devices, versions, the environment record, peak memory
    memory       bytes of weights and optimizer state; a compiled train
                 step's buffers before it runs (XLA's analysis, JAX); the
                 device's memory
    optimizer_updates  variables read as float32, as stored, or as a
                 layer's call read them; the replica path; torch's no_grad;
                 the integer operations of stochastic rounding; an update
                 of many variables at once over float32 copies (torch);
                 work XLA may not start before a value exists
    keras_internals  Keras's version, the versions kmp is tested with,
                 and Keras's private names got with a clear error
    recompute    the state a rematerialized call writes, the same in its
                 recomputation (dropout's seeds, moving statistics)
    layer_calls  a call set on one layer that runs on the layer running
                 it (NNX's transforms run a copy of the model)
    layouts      a tensor broadcast over the batch whose gradient XLA
                 does not lay out batch-innermost on a GPU (JAX)
    activations  an activation recomputed in the backward pass, which
                 XLA fuses into the matmul before it on a GPU (JAX)
    attention    causal attention that tells cuDNN's flash attention
                 its sliding window, where cuDNN takes it (JAX)
    normalization  batch normalization in one fused kernel (torch's;
                 XLA fuses Keras's ops on TensorFlow and JAX)
    steps        a train step's extra logs, gradients by intermediate
                 tensors, what compiles a step, crossentropy's logits,
                 code that runs once inside a trace, code no compiler
                 traces, the line a frame's code was written at
    scaler_ops   the loss scaler's branch, fused unscale, stateless copies,
                 a variable whose value a JAX step holds
    dtype_errors how TensorFlow, torch and JAX word a 16-bit/float32
                 mismatch, and kmp's line at the end of such an error in
                 a user's layer or step
    policy_hooks what kmp wraps in Keras while a 16-bit kmp policy is
                 in force (dtype_errors' line, `while_16_bit`), and the
                 switch
    random_state the framework's global random generator (torch's, which
                 unseeded layers draw from), kept by a run's backup
    distribution the active distribution, its mesh and the variables it
                 does not hold as laid out; JAX's processes (joined,
                 counted, gathered); agreement, sums and maxima over
                 `tf.distribute` replicas

A framework's longer bodies live in private modules that branch on
nothing and are imported inside their branch only: `_taped_gradients`,
`_torch_step`, `_torch_int_ops` (torch) and `_tf_replicas`
(TensorFlow), so kmp trains with `KERAS_BACKEND=jax` or `torch` on a
machine without TensorFlow.

Imports from kmp: errors, _version.

The rest of kmp calls these functions through this package
(`from kmp import backend; backend.list_devices()`).
"""

from kmp.backend._current import is_nnx
from kmp.backend._current import is_stateless
from kmp.backend._current import name
from kmp.backend.activations import recompute_in_backward
from kmp.backend.attention import causal_attention
from kmp.backend.distribution import all_replicas_agree
from kmp.backend.distribution import distribution_name
from kmp.backend.distribution import gather_over_processes
from kmp.backend.distribution import join_processes
from kmp.backend.distribution import layout_problems
from kmp.backend.distribution import max_over_replicas
from kmp.backend.distribution import mesh
from kmp.backend.distribution import processes
from kmp.backend.distribution import runtime_started
from kmp.backend.distribution import sum_over_replicas
from kmp.backend.dtype_errors import dtype_note
from kmp.backend.dtype_errors import is_users
from kmp.backend.dtype_errors import mismatched_dtypes
from kmp.backend.initialization import initialized_together
from kmp.backend.keras_internals import TESTED_KERAS
from kmp.backend.keras_internals import KerasInternalsError
from kmp.backend.keras_internals import keras_version
from kmp.backend.keras_internals import private_attribute
from kmp.backend.keras_internals import private_import
from kmp.backend.layer_calls import layer_call
from kmp.backend.layouts import broadcast_over_batch
from kmp.backend.machine import Device
from kmp.backend.machine import environment
from kmp.backend.machine import float16_attention_fails
from kmp.backend.machine import framework_versions
from kmp.backend.machine import host_cpu
from kmp.backend.machine import list_devices
from kmp.backend.machine import peak_memory
from kmp.backend.memory import device_memory_limit
from kmp.backend.memory import state_bytes
from kmp.backend.memory import train_step_memory
from kmp.backend.memory import variable_bytes
from kmp.backend.normalization import fused_batch_norm
from kmp.backend.optimizer_updates import float32_reads
from kmp.backend.optimizer_updates import float32_working_copies
from kmp.backend.optimizer_updates import integer_ops
from kmp.backend.optimizer_updates import optimizer_class
from kmp.backend.optimizer_updates import ordered_after
from kmp.backend.optimizer_updates import outside_autograd
from kmp.backend.optimizer_updates import reads_in_force
from kmp.backend.optimizer_updates import stored_dtype
from kmp.backend.optimizer_updates import stored_reads
from kmp.backend.optimizer_updates import updates_in_groups
from kmp.backend.optimizer_updates import updates_per_replica
from kmp.backend.policy_hooks import dtype_notes_on
from kmp.backend.policy_hooks import note_dtype_errors
from kmp.backend.policy_hooks import while_16_bit
from kmp.backend.random_state import random_state
from kmp.backend.random_state import restore_random_state
from kmp.backend.recompute import RecomputedState
from kmp.backend.scaler_ops import cond
from kmp.backend.scaler_ops import fused_unscale
from kmp.backend.scaler_ops import held_by_the_step
from kmp.backend.scaler_ops import own_values
from kmp.backend.settings import disable_tf32
from kmp.backend.settings import tf32_enabled
from kmp.backend.settings import use_compile_cache
from kmp.backend.steps import add_train_step_logs
from kmp.backend.steps import crossentropy_reads_logits
from kmp.backend.steps import out_of_trace
from kmp.backend.steps import step_compiler
from kmp.backend.steps import taped_gradients
from kmp.backend.steps import tracing
from kmp.backend.steps import uncompiled
from kmp.backend.steps import written_at

__all__ = [
    "Device",
    "KerasInternalsError",
    "RecomputedState",
    "TESTED_KERAS",
    "add_train_step_logs",
    "all_replicas_agree",
    "broadcast_over_batch",
    "causal_attention",
    "cond",
    "crossentropy_reads_logits",
    "device_memory_limit",
    "disable_tf32",
    "distribution_name",
    "dtype_note",
    "dtype_notes_on",
    "mesh",
    "environment",
    "float16_attention_fails",
    "framework_versions",
    "fused_batch_norm",
    "float32_reads",
    "float32_working_copies",
    "fused_unscale",
    "gather_over_processes",
    "held_by_the_step",
    "host_cpu",
    "initialized_together",
    "integer_ops",
    "is_nnx",
    "is_stateless",
    "keras_version",
    "is_users",
    "join_processes",
    "layer_call",
    "layout_problems",
    "list_devices",
    "max_over_replicas",
    "mismatched_dtypes",
    "name",
    "note_dtype_errors",
    "out_of_trace",
    "optimizer_class",
    "ordered_after",
    "private_attribute",
    "private_import",
    "outside_autograd",
    "own_values",
    "peak_memory",
    "processes",
    "random_state",
    "recompute_in_backward",
    "restore_random_state",
    "runtime_started",
    "step_compiler",
    "reads_in_force",
    "stored_dtype",
    "stored_reads",
    "state_bytes",
    "sum_over_replicas",
    "taped_gradients",
    "tracing",
    "tf32_enabled",
    "train_step_memory",
    "uncompiled",
    "written_at",
    "updates_in_groups",
    "updates_per_replica",
    "use_compile_cache",
    "variable_bytes",
    "while_16_bit",
]
