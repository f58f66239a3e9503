"""A converted or pinned layer's policy, kept by a `.keras` file: the
policy of a layer that another layer makes in its own code goes into
its maker's `DTypePolicyMap` (`record_policies`); and the policy of a
float32 island over bfloat16 master weights (`float32_policy`).

`kmp.pin_float32` and `kmp.float8` change layers' policies in place; a
layer a Functional or Sequential config lists saves its own, the others
need this (KerasHub's way to save quantized layers).
"""

import keras

_OVER = "float32_over_"


@keras.saving.register_keras_serializable("kmp")
class Float32Compute(keras.DTypePolicy):
    """Computes in float32 over variables of another dtype.

    Keras's policies compute in their variables' dtype or in a narrower
    one (`"mixed_bfloat16"`); none computes in float32 over bfloat16
    variables, which a float32 island (`kmp.pin_float32`) needs under
    bfloat16 master weights: with Keras's `"float32"` a `.keras` file
    would reload the island's weights (a language model's tied
    embedding: its largest tensor) in float32. The name says both:
    `"float32_over_bfloat16"`.

    Args:
        name: `"float32_over_" + variable dtype`.
    """

    def __init__(self, name=_OVER + "bfloat16"):
        super().__init__(name)

    def _parse_name(self, name):
        if isinstance(name, str) and name.startswith(_OVER):
            variable = keras.backend.standardize_dtype(name[len(_OVER) :])
            return "float32", variable
        return super()._parse_name(name)


def float32_policy(layer) -> keras.DTypePolicy:
    """The policy that makes `layer` compute in float32 and keeps its
    variables' dtype: Keras's `"float32"` over float32 variables,
    `Float32Compute` over bfloat16 master weights."""
    variable_dtype = layer.dtype_policy.variable_dtype
    if variable_dtype in ("float32", None) or "float" not in variable_dtype:
        return keras.DTypePolicy("float32")
    return Float32Compute(_OVER + variable_dtype)


def pin_to_float32(layer):
    """Makes `layer` compute in float32, its variables' dtype kept
    (`float32_policy`), so that a `.keras` file reloads it so.

    When it loads a layer's own config, Keras turns a policy back into
    its name, and `DTypePolicy("float32_over_bfloat16")` is no Keras
    policy; a `DTypePolicyMap` it keeps as it is. So a `Float32Compute`
    goes in as the default of a map of its own (the layer finds no path
    of its own in it, and takes the default); inside another layer's map
    (`record_policies`) it goes as it is.
    """
    policy = float32_policy(layer)
    own = layer.dtype_policy
    mapped = isinstance(own, keras.dtype_policies.DTypePolicyMap)
    if isinstance(policy, Float32Compute) and not mapped:
        policy = keras.dtype_policies.DTypePolicyMap(default_policy=policy)
    layer.dtype_policy = policy


def record_policies(model, policies) -> list:
    """Makes `model`'s saved config keep each `policies[layer]`, for layers
    nested in `model`; returns the layers whose policy a saved config may
    not keep.

    A layer listed in a Functional or Sequential model saves its own
    dtype policy. A layer that another layer makes in its own code (an
    attention's projections, a KerasHub backbone's blocks) is rebuilt on
    load by that code, from that outer layer's config. Keras's way to
    reach it is a `DTypePolicyMap` (path -> policy) as the outer layer's
    `dtype`: the outer layer passes it on as its sublayers' `dtype`, and
    each looks its own path up there (KerasHub backbones keep quantized
    layers this way). So each policy goes into the map of the outermost
    such layer, the host: one whose config records a `dtype`. A KerasHub
    task saves no `dtype` of its own and makes its head with its
    backbone's, so its backbone hosts the head's.

    Returned: layers with no host; layers with no `path` (one without
    weights, such as a `Softmax`: Keras sets paths when it builds
    weights, and a map finds layers by path); and layers whose host is a
    class of the user's, whose code may not pass its `dtype` on (Keras's
    and KerasHub's layers do).

    Args:
        model: The model the layers are in.
        policies: A dict from layer to `keras.DTypePolicy`.
    """
    owners = _owners(model)
    hosts = {}  # id -> whether that layer records a dtype (asked once)

    def records(layer):
        if id(layer) not in hosts:
            hosts[id(layer)] = _records_dtype(layer)
        return hosts[id(layer)]

    unsure = []
    for layer, policy in policies.items():
        chain = [layer]
        while id(chain[0]) in owners and chain[0] is not model:
            chain.insert(0, owners[id(chain[0])])
        host = next((outer for outer in chain if records(outer)), None)
        if host is layer and len(chain) > 1:
            host = _backbone_hosting(chain[-2]) or host
        if host is layer:
            continue  # its own config keeps it
        if host is None or not layer.path:
            unsure.append(layer)
            continue
        _put(host, layer.path, policy)
        if not type(host).__module__.startswith(_LIBRARIES):
            unsure.append(layer)
    return unsure


# Libraries whose layers pass their dtype on to the layers they make.
_LIBRARIES = ("keras.", "keras_hub.", "kmp.")


def _backbone_hosting(owner):
    """A KerasHub task's backbone, when `owner` is such a task: a model
    that neither lists its layers nor saves a `dtype`, and builds its own
    layers (the head) with its backbone's `dtype`."""
    if _lists_its_layers(owner) or _records_dtype(owner):
        return None
    backbone = getattr(owner, "backbone", None)
    if isinstance(backbone, keras.layers.Layer) and _records_dtype(backbone):
        return backbone
    return None


def _owners(model) -> dict:
    """Each nested layer's id -> the layer that owns it: of the layers
    that hold it, the deepest. A KerasHub task holds its backbone's
    output embedding (its graph uses it) and the backbone holds it too;
    the backbone made it and rebuilds it."""
    depth, owners, queue = {id(model): 0}, {}, [model]
    while queue:
        outer = queue.pop(0)
        for child in outer._flatten_layers(include_self=False, recursive=False):
            if id(child) not in depth:
                depth[id(child)] = depth[id(outer)] + 1
                queue.append(child)
            owner = owners.get(id(child))
            if owner is None or depth[id(owner)] < depth[id(outer)]:
                owners[id(child)] = outer
    return owners


def _lists_its_layers(layer) -> bool:
    """Whether `layer` is a Keras Functional or Sequential model, whose
    config lists each of its layers with the layer's own config."""
    cls = type(layer)
    return cls.__module__.startswith("keras.") and cls.__name__ in (
        "Functional",
        "Sequential",
    )


def _records_dtype(layer) -> bool:
    """Whether `layer` can host policies: its config records a `dtype`,
    and it does not list its layers."""
    if _lists_its_layers(layer):
        return False
    if _keras_config(type(layer)):
        # Keras's layers chain to `Layer.get_config`, which writes it.
        # (Asking would import TensorFlow, where installed, under JAX and
        # torch: Keras's serialization checks for its TensorShape.)
        return True
    try:
        return "dtype" in layer.get_config()
    except (NotImplementedError, TypeError, ValueError):
        # A user layer whose config cannot be written hosts nothing.
        return False


def _keras_config(cls) -> bool:
    """Whether `cls`'s config is Keras's: its constructor and `get_config`
    are both Keras's own (Keras's layers, and subclasses that change only
    how they compute, such as kmp's float8 layers)."""
    return all(
        getattr(cls, name).__module__.startswith("keras.")
        for name in ("__init__", "get_config")
    )


def _put(host, path, policy):
    current = host.dtype_policy
    if not isinstance(current, keras.dtype_policies.DTypePolicyMap):
        current = keras.dtype_policies.DTypePolicyMap(default_policy=current)
        # Set directly: the setter would look the host's own path up in
        # the map, and act on what it finds there.
        host._dtype_policy = current
    keys = [path]
    prefix = f"{host.name}/"
    if _is_subclassed_model(host) and path.startswith(prefix):
        # Such a model's layers get their paths when they build: under
        # its name when it is first called, without it when a load
        # builds it from its build config. Both find the policy.
        keys.append(path[len(prefix) :])
    for key in keys:
        if key in current:
            del current[key]
        current[key] = policy


def _is_subclassed_model(layer) -> bool:
    """A `keras.Model` with no recorded graph (no `outputs`)."""
    return isinstance(layer, keras.Model) and not getattr(
        layer, "outputs", None
    )
