"""The line kmp adds to an error where a user's layer or train step mixes
16-bit and float32 tensors under a kmp policy.

Under `mixed_float16` a layer computes in float16, and a tensor it makes
itself in float32 (`keras.random.normal(shape)`, a constant, the step's
data) meets its float16 tensors. Keras's ops promote, and so do JAX and
torch for most ops; TensorFlow's own ops do not (`a * b` on TensorFlow
tensors, `tf.concat`), nor torch's matmuls: the user reads "Input 'y' of
'Mul' Op has type float32 that does not match type float16 of argument
'x'" from deep inside the framework. While a 16-bit kmp policy is in
force (`kmp.enable`, `kmp.policy_scope`), such an error ends with one
line naming the user's layer, the two dtypes and the fix:

    kmp: Sampling 'sampling' computes in float16 (mixed_float16) and
    its call mixed float16 with float32: give the float32 tensor the
    layer's dtype (keras.random.normal(..., dtype=self.compute_dtype),
    ...), or run the layer in float32: ...

Where the line comes from: `dtype_note`, which the wrappers of
`policy_hooks` call on the way out of a layer's call or a step's `fit`.
The layer named is the innermost frame of the traceback whose `self` is
a layer of the user's (not of Keras, KerasHub or kmp); the line is added
once. The exception's type and message are Keras's.

An op that has no 16-bit form (Keras's FFTs, on TensorFlow and JAX)
refusing a user's layer's 16-bit input gets a line of its own, naming
the layer and the cast, and so does a `Lambda` whose output shape Keras
failed to infer in 16 bits (Keras drops the error that failed it). Two
errors of 16-bit training that no layer of the user's raises get a line
of their own too: TensorFlow's refusal to sum a layer's float16
`add_loss` value with the float32 loss (in Keras's `compute_loss`), and
JAX's CPU refusing the float16 matmul with float32 accumulation that
Keras's fused attention asks for. (TensorFlow's refusal inside Keras's
`Normalization.adapt` over a dataset has none: under kmp's policies the
layer adapts in float32, `kmp.islands.feature_normalization`.) A Keras
`Lambda` whose function of the user's raised is named as the user's
layer.
"""

import re
import traceback

import keras

from kmp_config.names import HALF_DTYPES

PREFIX = "kmp: "

# Packages whose layers and frames are not the user's.
LIBRARIES = frozenset(
    ("keras", "keras_hub", "keras_nlp", "keras_cv", "kmp", "tf_keras")
    + ("tensorflow", "jax", "jaxlib", "torch", "numpy", "optree")
)

# How TensorFlow (graph and eager), torch and JAX name the two dtypes of
# a mismatch. Each pattern captures the dtypes it names.
_MISMATCHES = (
    # TensorFlow, traced: "Input 'y' of 'Mul' Op has type float32 that
    # does not match type float16 of argument 'x'."
    r"has type (\w+) that does not match type (\w+)",
    # TensorFlow, traced list: "... 'ConcatV2' Op have types [float16,
    # float32] that don't all match."
    r"have types \[([\w, ]+)\] that don't all match",
    # TensorFlow, eager: "... was expected to be a half tensor but is a
    # float tensor"
    r"expected to be a (\w+) tensor but is a (\w+) tensor",
    # TensorFlow's `/` (`math_ops.truediv`, eager and traced): "`x` and
    # `y` must have the same dtype, got tf.float16 != tf.float32."
    r"`x` and `y` must have the same dtype, got ([\w.]*\w) != ([\w.]*\w)",
    # torch: "expected m1 and m2 to have the same dtype, but got:
    # c10::Half != float", "mat1 and mat2 must have the same dtype, but
    # got Half and Float", "expected scalar type Half but found Float"
    r"same dtype, but got:? ([\w:.]+) (?:!=|and) ([\w:.]+)",
    r"expected scalar type (\w+) but found (\w+)",
    # torch: "Input type (torch.HalfTensor) and weight type
    # (torch.FloatTensor) should be the same"
    r"Input type \(([\w:.]+)\) and \w+ type \(([\w:.]+)\) should be",
    # JAX's lax: "lax.add requires arguments to have the same dtypes,
    # got float16, float32."
    r"to have the same dtypes, got ([\w, ]+)",
    # TensorFlow, a list made one tensor: "Cannot convert a list
    # containing a tensor of dtype <dtype: 'float16'> to <dtype:
    # 'float32'>" (`_LOSSES`).
    r"list containing a tensor of dtype <dtype: '(\w+)'> to <dtype: '(\w+)'>",
)

# The list error where no layer of the user's is in the traceback: Keras's
# `compute_loss` sums the compiled loss with the `add_loss` losses
# (`ops.sum(losses)`) and casts only integer ones, so a layer's float16
# `add_loss` value meets the float32 loss; JAX and torch promote the
# list, TensorFlow does not. Keras's frame is filtered from the traceback.
_LOSSES = "list containing a tensor of dtype"

# JAX's CPU backend refuses a 16-bit matmul that accumulates in float32
# ("The precision 'F16_F16_F32' is not supported by dot_general on
# CPU"), which Keras's fused attention asks for under mixed_float16: at
# compile time, in no layer's frame. A GPU has it.
_CPU_DOT = re.compile(
    r"'(B?F16)_\1_F32' is not supported by dot_general on CPU"
)

# An op with no 16-bit form refusing a 16-bit input: TensorFlow's and
# JAX's complex numbers, which Keras's FFTs make (keras-io's FNet's
# `keras.ops.fft2` on its float16 input, TensorFlow: "The `real` and
# `imag` components have incorrect types: float16 float16"; JAX:
# "complex does not accept dtype float16").
_NO_HALF = re.compile(
    r"components have incorrect types: (b?float16)"
    r"|complex does not accept dtype (b?float16)"
)

# Keras's `Lambda` without `output_shape` infers it by calling its
# function on inputs of its compute dtype, and on any error raises this,
# the error itself dropped (a bare `except`): under a 16-bit policy most
# likely an op refusing 16 bits (an FFT: a helper's run of keras-io-style
# code, 2026-11-30).
_LAMBDA_SHAPE = "could not automatically infer the shape of the Lambda"

# How Keras rewrites an error of a layer's call on symbolic inputs
# (`Operation.compute_output_spec`): a Functional model being built, or
# a subclassed one built from shapes. No model exists yet for
# `kmp.pin_float32(model, also=...)` to reach (the masking guide's
# `TemporalSoftmax`, in a Functional model, on TensorFlow).
_BUILDING = "Could not automatically infer the output shape / dtype"

_NAMES = {
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
    "double": "float64",
    "float64": "float64",
}


def mismatched_dtypes(error) -> tuple | None:
    """The two floating dtypes an error says were mixed, 16-bit first, or
    None if it is not such an error (or neither dtype is 16-bit)."""
    message = str(error)
    for pattern in _MISMATCHES:
        found = re.search(pattern, message)
        if found is None:
            continue
        named = ", ".join(found.groups()).split(",")
        dtypes = {_canonical(name) for name in named} - {None}
        half = sorted(dtypes & set(HALF_DTYPES))
        if len(dtypes) == 2 and half:
            return half[0], (dtypes - {half[0]}).pop()
    return None


def _canonical(name):
    name = name.strip().lower().rsplit("::", 1)[-1].rsplit(".", 1)[-1]
    return _NAMES.get(name.removesuffix("tensor"))


def is_users(obj) -> bool:
    """Whether a class or function, or a module given by name, is the
    user's code, not a library's."""
    module = obj if isinstance(obj, str) else getattr(obj, "__module__", "")
    return (module or "").split(".")[0] not in LIBRARIES


def _culprit(error, layer):
    """The innermost `(layer, method name)` of the user's in the error's
    traceback (its frames' `self`, or a `Lambda` layer whose function of
    the user's raised), else `(layer, "call")` if `layer` is the user's,
    else None."""
    found = lambda_layer = None
    for frame, _ in traceback.walk_tb(error.__traceback__):
        owner = frame.f_locals.get("self")
        if isinstance(owner, keras.layers.Lambda):
            # Keras's class, the user's function: the layer to fix.
            lambda_layer = owner
            continue
        if not is_users(frame.f_globals.get("__name__", "")):
            continue
        if isinstance(owner, keras.layers.Layer) and is_users(type(owner)):
            found = owner, frame.f_code.co_name
        elif lambda_layer is not None and frame.f_code is getattr(
            lambda_layer.function, "__code__", None
        ):
            found = lambda_layer, "call"
    if found is None and layer is not None and is_users(type(layer)):
        found = layer, "call"
    return found


def dtype_note(error, layer=None) -> str | None:
    """Adds kmp's line to `error` if a user's layer (the innermost in its
    traceback, or `layer`) mixed a 16-bit dtype with another under a
    16-bit policy, or for the two errors of the module docstring's last
    paragraph; returns the line, or None. Adds it once."""
    if any(n.startswith(PREFIX) for n in getattr(error, "__notes__", ())):
        return None
    line = _line_for(error, layer)
    if line is not None:
        error.add_note(line)
    return line


def _line_for(error, layer):
    refused = _CPU_DOT.search(str(error))
    if refused:
        return _cpu_dot_line(refused.group(1))
    building = _BUILDING in str(error)
    if _LAMBDA_SHAPE in str(error) and isinstance(layer, keras.layers.Lambda):
        if layer.compute_dtype not in HALF_DTYPES:
            return None
        return _lambda_shape_line(layer)
    no_half = _NO_HALF.search(str(error))
    if no_half:
        culprit = _culprit(error, layer)
        if culprit is None or culprit[0].compute_dtype not in HALF_DTYPES:
            return None
        half = no_half.group(1) or no_half.group(2)
        return _no_half_line(culprit[0], half, building)
    dtypes = mismatched_dtypes(error)
    if dtypes is None:
        return None
    policy = keras.config.dtype_policy()
    culprit = _culprit(error, layer)
    if culprit is None:
        if layer is None and _LOSSES in str(error):
            return _losses_line(dtypes, policy)
        return None
    owner, method = culprit
    if owner.compute_dtype not in HALF_DTYPES and (
        policy.compute_dtype not in HALF_DTYPES
    ):
        return None
    return _line(owner, method, dtypes, building=building)


def _cpu_dot_line(precision):
    """The line for JAX's CPU refusing a 16-bit matmul (`_CPU_DOT`)."""
    half = "bfloat16" if precision == "BF16" else "float16"
    return (
        f"{PREFIX}JAX on a CPU has no {half} matmul that accumulates in "
        "float32, which Keras's fused attention (ops.dot_product_attention,"
        f" MultiHeadAttention) asks for in {half}; a GPU has it. On a CPU, "
        "train in float32 (kmp.enable('auto') picks it there)"
        + (" or mixed_bfloat16." if half == "float16" else ".")
    )


def _losses_line(dtypes, policy):
    """The line for a step's list of 16-bit and float32 losses (`_LOSSES`),
    under a 16-bit policy; None under another."""
    if policy.compute_dtype not in HALF_DTYPES:
        return None
    half, other = dtypes
    return (
        f"{PREFIX}the step summed a {half} loss with {other} ones, outside "
        "any layer of yours: most likely a layer's add_loss value, which "
        f"under {policy.name} is {half}, and TensorFlow adds the losses "
        f"without promoting: pass add_loss a {other} value "
        f"(self.add_loss(keras.ops.cast(loss, '{other}'))), or run that "
        f"layer in float32 (kmp.pin_float32(model, also=[...]))."
    )


def _line(owner, method, dtypes, building=False):
    half, other = dtypes
    cls = type(owner).__name__
    held = _half_outputs(owner)
    # A step, or a model's helper beside its call (keras-io's WGAN-GP's
    # `gradient_penalty`) that may meet a sub-model's 16-bit output:
    # running the model itself in float32 would not change that output's
    # dtype. Which side the op's tensors came from the error does not
    # say, so the line gives the cast (always a fix) first.
    if method.endswith("_step") or (held and method != "call"):
        pins = ", ".join(f"kmp.pin_float32(self.{name})" for name in held)
        return (
            f"{PREFIX}{cls}.{method} runs under "
            f"{keras.config.dtype_policy().name} and mixed {half} with "
            f"{other} in an op that does not promote: cast one side "
            f"(keras.ops.cast(x, '{other}')) or use keras.ops, which "
            "promote; or, where one side is a sub-model's output, make "
            "that output float32"
            + (f": {pins}." if pins else " (kmp.pin_float32).")
        )
    if isinstance(owner, keras.layers.Lambda):
        # keras-io's diffusion model's sinusoidal embedding: the user's
        # function has no `self` to take a dtype from.
        function = getattr(owner.function, "__name__", "function")
        what = f"its function {function}"
        fix = f"cast one side inside it (keras.ops.cast(x, '{other}'))"
        made = f"{cls}({function}, ..., dtype='float32')"
    else:
        what = f"its {method}"
        fix = (
            f"give the {other} tensor the layer's dtype "
            "(keras.random.normal(..., dtype=self.compute_dtype), "
            "keras.ops.cast(x, self.compute_dtype))"
        )
        made = f"{cls}(..., dtype='float32')"
    return (
        f"{PREFIX}{cls} '{owner.name}' computes in {owner.compute_dtype} "
        f"({owner.dtype_policy.name}) and {what} mixed {half} with "
        f"{other}: {fix}, or run the layer in float32: {made}"
        f"{_pin_fix(owner, building)}."
    )


def _pin_fix(owner, building):
    """How `kmp.pin_float32` runs `owner` in float32, or why it cannot."""
    if building:
        # The error stops the model's build: only the layer's own
        # dtype, where the user makes it, can run it in float32.
        return (
            ", where you make it; kmp.pin_float32(model, also=[...]) "
            "cannot, as this error stops the model being built"
        )
    # By class, not by name: every instance runs the code that failed
    # (keras-io's CCT has four StochasticDepth layers, and pinning the
    # one named left the next to fail).
    cls = type(owner).__name__
    target = (
        f"'{owner.name}'" if isinstance(owner, keras.layers.Lambda) else cls
    )
    return (
        f", or kmp.pin_float32(model, also=[{target}]) on the model that "
        "holds it (a subclassed model's layers are there before its build)"
    )


def _lambda_shape_line(layer):
    """The line for a `Lambda` whose shape Keras failed to infer in 16
    bits (`_LAMBDA_SHAPE`)."""
    function = getattr(layer.function, "__name__", "function")
    return (
        f"{PREFIX}Lambda '{layer.name}' computes in {layer.compute_dtype} "
        f"({layer.dtype_policy.name}), and Keras ran {function} on "
        f"{layer.compute_dtype} inputs to infer its output shape: an op "
        "in it that refuses 16 bits (an FFT, or a float32 tensor meeting "
        "a 16-bit one) fails it so, its own error dropped. Give "
        "output_shape=... to see that error, or run it in float32: "
        f"Lambda({function}, ..., dtype='float32')."
    )


def _no_half_line(owner, half, building):
    """The line for an op that has no 16-bit form (`_NO_HALF`)."""
    cls = type(owner).__name__
    return (
        f"{PREFIX}{cls} '{owner.name}' computes in {owner.compute_dtype} "
        f"({owner.dtype_policy.name}) and passed {half} to an op that has "
        "no 16-bit form (an FFT: keras.ops.fft, fft2, rfft, stft): cast "
        "its input to float32 there (keras.ops.cast(x, 'float32')) and "
        "the result back to self.compute_dtype, or run the layer in "
        f"float32: {cls}(..., dtype='float32'){_pin_fix(owner, building)}."
    )


def _half_outputs(model):
    """The attributes of `model` holding sub-models whose output layers
    compute in 16 bits (a GAN's generator), by name."""
    names = []
    for name, value in vars(model).items():
        outputs = getattr(value, "outputs", None)
        if not isinstance(value, keras.Model) or not outputs:
            continue
        makers = [
            t._keras_history.operation for t in keras.tree.flatten(outputs)
        ]
        if any(
            getattr(maker, "compute_dtype", None) in HALF_DTYPES
            for maker in makers
        ):
            names.append(name)
    return names
