"""A converted or pinned layer's policy, kept by a `.keras` file: the
policy of a layer that another layer makes in its own code goes into
its maker's `DTypePolicyMap` (`record_policies`).

`kmp.pin_float32` and `kmp.float8` change layers' policies in place; a
layer a Functional or Sequential config lists saves its own, the others
need this (KerasHub's way to save quantized layers).
"""

import keras


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
    if type(layer).__module__.startswith("keras."):
        # Keras's layers chain to `Layer.get_config`, which writes it.
        # (Asking would import TensorFlow, where installed, under JAX and
        # torch: Keras's serialization checks for its TensorShape.)
        return True
    try:
        return "dtype" in layer.get_config()
    except (NotImplementedError, TypeError, ValueError):
        # A user layer whose config cannot be written hosts nothing.
        return False


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
