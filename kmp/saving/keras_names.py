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
it. So `ranked` writes each part of a path that Keras made up as its
rank among the made-up parts that share its scope and name
(`block/dense_1` and `block/dense_2` -> `block/dense#0`,
`block/dense#1`), and `pair_weights` pairs a run's saved weights with a
load's variables by those paths, all of them or none.

Not every name is made up: a Functional model's layers take the names
of its config, and a layer's code may name its layers (`name="head"`,
or even `name="dense_1"`). Those are the same in every process, and
must keep their place: a made-up `dense` ranked beside a config's
`dense_1` and `dense_3` would take another rank in the run than in the
load, and two layers of one shape would trade values (a reviewer,
2026-12-01). So the load counts the names Keras makes up while it runs
(`names_made`), and every other part of its paths, and the run's parts
at the same paths, are kept as they are.
"""

import contextlib
import re
from collections import defaultdict

from kmp.backend import private_import

# `dense_12` -> ("dense", 12); `dense` -> ("dense", -1): first of its name.
_COUNTED = re.compile(r"^(.*?)_(\d+)$")
# A dropout's random state (`seed_generator_3/seed_generator_state`): a
# fresh one draws other masks and loses nothing, so it need not pair.
SEED_STATE = "/seed_generator_state"


@contextlib.contextmanager
def names_made(made):
    """Adds to the set `made` each name Keras makes up (`dense_3`, for a
    layer made without `name=`) while the block runs.

    Keras counts the names it gives per class in a global attribute and
    writes the `n`-th as `dense_n` (the first as `dense`), so the counts
    before and after tell every name given in between.
    """
    counts = private_import(
        "keras.src.backend.common.global_state",
        "get_global_attribute",
        "kmp.load_model of a checkpoint directory",
    )
    before = dict(counts("object_name_uids") or {})
    try:
        yield
    finally:
        for prefix, count in (counts("object_name_uids") or {}).items():
            for k in range(before.get(prefix, 0), count):
                made.add(prefix if k == 0 else f"{prefix}_{k}")


def ranked(paths, keeps=lambda scope, part: False) -> dict:
    """`{path: ranked path}`: each part of each path written as its rank
    among the parts of `paths` in the same scope with the same name but
    for Keras's count, but for the parts that `keeps`, which stay as
    they are (and take no rank).

    Args:
        paths: variable paths (`"block/dense_2/kernel"`).
        keeps: `keeps(scope, part)`: whether `part` keeps its name, where
            `scope` is the ranked path of the scope it is in.

    Example:

    ```python
    ranked(
        ["block/dense_1/kernel", "block/dense_2/kernel"],
        keeps=lambda scope, part: part in ("block", "kernel"),
    )
    # {"block/dense_1/kernel": "block/dense#0/kernel",
    #  "block/dense_2/kernel": "block/dense#1/kernel"}
    ```
    """
    parts = {tuple(path.split("/")) for path in paths}
    ranks = {(): ""}  # a path's parts -> its ranked path
    # Depth by depth: whether a part keeps its name may depend on the
    # ranked path of its scope.
    for depth in range(max(map(len, parts), default=0)):
        siblings = defaultdict(set)  # (scope, name) -> {(count, part)}
        for scope, part in {
            (p[:depth], p[depth]) for p in parts if len(p) > depth
        }:
            if keeps(ranks[scope], part):
                ranks[(*scope, part)] = _joined(ranks[scope], part)
            else:
                name, count = _uncounted(part)
                siblings[scope, name].add((count, part))
        for (scope, name), counted in siblings.items():
            for place, (_, part) in enumerate(sorted(counted)):
                ranks[(*scope, part)] = _joined(ranks[scope], f"{name}#{place}")
    return {path: ranks[tuple(path.split("/"))] for path in paths}


def _joined(scope, part):
    return f"{scope}/{part}" if scope else part


def _uncounted(part):
    """`(name, count)` of a path's part: Keras's count split off."""
    found = _COUNTED.match(part)
    if found is None:
        return part, -1
    return found.group(1), int(found.group(2))


def pair_weights(saved, variables, made=(), scope="") -> dict:
    """`{saved path: variable}` pairing every weight a run saved with the
    loaded model's variable of the same ranked path (`ranked`) and
    shape, or `{}` where one of either pairs with none or with several.

    The parts of the load's paths whose names Keras did not make up in
    the load (`made`) are kept as they are, on both sides. The run may
    have made its variables inside the model's own name scope (`fit`
    builds a subclassed or Sequential model so, a load does not: the
    run's `net/dense/kernel`, the load's `dense/kernel`): a saved path
    in `scope` (the model's name) is read without it. A dropout's random
    state pairs where it can, and need not.

    Args:
        saved: `{path: shape}` of the weights a checkpoint holds.
        variables: the loaded model's weights.
        made: the names Keras made up in the load (`names_made`).
        scope: the model's name.
    """
    own = [v.path for v in variables]
    kept = set()

    def ours_keeps(scope, part):
        if part in made:
            return False
        kept.add((scope, part))
        return True

    ours = ranked(own, ours_keeps)
    inner = {
        p: p[len(scope) + 1 :] if scope and p.startswith(scope + "/") else p
        for p in saved
    }
    if len(set(inner.values())) < len(inner):
        return {}  # a path saved both in the model's scope and outside
    # A part of the run's keeps its name where the load's at that ranked
    # path kept its own.
    ranks = ranked(list(inner.values()), lambda *at: at in kept)
    theirs = {p: ranks[inner[p]] for p in inner}
    by_rank = defaultdict(list)
    for path, rank in theirs.items():
        by_rank[rank].append(path)
    pairs = {}
    for variable in variables:
        found = [
            p
            for p in by_rank.get(ours[variable.path], ())
            if tuple(saved[p]) == tuple(variable.shape)
        ]
        if len(found) != 1 or found[0] in pairs:
            if variable.path.endswith(SEED_STATE):
                continue
            return {}
        pairs[found[0]] = variable
    unpaired = [p for p in saved if p not in pairs]
    if any(not p.endswith(SEED_STATE) for p in unpaired):
        return {}
    return pairs
