"""Keras's generated layer names, made comparable across processes.

Keras names a layer made without `name=` after its class and a count the
process keeps (`dense`, `dense_1`, ...), so the same code names the same
layers differently in a process that made other layers before: a run in
a notebook saved `block/dense_1/kernel` and `block/dense_2/kernel`, a
load in a new process makes `block/dense/kernel` and
`block/dense_1/kernel`. A checkpoint directory is assigned by path
(Keras's `set_state_tree`), so that load gives the block's second layer
its first one's values, and the first one none.

What stays is the order: one piece of code makes one scope's layers of
one class in the same order in every process, and the counts grow with
it. So `ranked` writes each part of a path as its rank among the
parts that share its scope and name (`block/dense_1` and
`block/dense_2` -> `block#0/dense#0`, `block#0/dense#1`), and
`pair_weights` pairs a run's saved weights with a load's variables by
those paths, all of them or none.
"""

import re
from collections import defaultdict

# `dense_12` -> ("dense", 12); `dense` -> ("dense", -1): first of its name.
_COUNTED = re.compile(r"^(.*?)_(\d+)$")
# A dropout's random state (`seed_generator_3/seed_generator_state`): a
# fresh one draws other masks and loses nothing, so it need not pair.
SEED_STATE = "/seed_generator_state"


def ranked(paths) -> dict:
    """`{path: ranked path}`: each part of each path written as its rank
    among the parts of `paths` in the same scope with the same name but
    for Keras's count.

    Args:
        paths: variable paths (`"block/dense_2/kernel"`).

    Example:

    ```python
    ranked(["block/dense_1/kernel", "block/dense_2/kernel"])
    # {"block/dense_1/kernel": "block#0/dense#0/kernel#0",
    #  "block/dense_2/kernel": "block#0/dense#1/kernel#0"}
    ```
    """
    siblings = defaultdict(set)  # (scope, name) -> {(count, part)}
    for path in paths:
        parts = path.split("/")
        for i, part in enumerate(parts):
            name, count = _uncounted(part)
            siblings["/".join(parts[:i]), name].add((count, part))
    rank = {}
    for (scope, name), parts in siblings.items():
        for place, (_, part) in enumerate(sorted(parts)):
            rank[scope, part] = f"{name}#{place}"
    return {
        path: "/".join(
            rank["/".join(path.split("/")[:i]), part]
            for i, part in enumerate(path.split("/"))
        )
        for path in paths
    }


def _uncounted(part):
    """`(name, count)` of a path's part: Keras's count split off."""
    found = _COUNTED.match(part)
    if found is None:
        return part, -1
    return found.group(1), int(found.group(2))


def pair_weights(saved, variables) -> dict:
    """`{saved path: variable}` pairing every weight a run saved with the
    loaded model's variable of the same ranked path (`ranked`) and
    shape, or `{}` where one of either pairs with none or with several.

    The run may have made its variables inside the model's own name scope
    (`fit` builds a subclassed or Sequential model so, a load does not:
    the run's `net/dense/kernel`, the load's `dense/kernel`), so a saved
    path pairs where it ends with the variable's ranked path (after a
    `/`); of several, the one with the fewest outer scopes. A dropout's
    random state pairs where it can, and need not.

    Args:
        saved: `{path: shape}` of the weights a checkpoint holds.
        variables: the loaded model's weights.
    """
    ours = ranked([v.path for v in variables])
    theirs = ranked(list(saved))
    pairs = {}
    for variable in variables:
        found = _nearest(
            p
            for p, rank in theirs.items()
            if (rank == ours[variable.path])
            or rank.endswith("/" + ours[variable.path])
            if tuple(saved[p]) == tuple(variable.shape)
        )
        if len(found) != 1 or found[0] in pairs:
            if variable.path.endswith(SEED_STATE):
                continue
            return {}
        pairs[found[0]] = variable
    unpaired = [p for p in saved if p not in pairs]
    if any(not p.endswith(SEED_STATE) for p in unpaired):
        return {}
    return pairs


def _nearest(paths) -> list:
    """Those of `paths` with the fewest parts."""
    paths = list(paths)
    fewest = min((p.count("/") for p in paths), default=0)
    return [p for p in paths if p.count("/") == fewest]
