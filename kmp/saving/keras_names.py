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
at the same paths, are kept as they are. A name both made up for one
layer and given to another (a config's `dense` at the root, a made-up
`dense` in a block) is tried both ways at each place it is at; where
two choices pair differently, nothing is paired, and the load says what
is lost.
"""

import contextlib
import itertools
import re
from collections import defaultdict
from typing import NamedTuple

import keras

from kmp.backend import private_import

# `dense_12` -> ("dense", 12); `dense` -> ("dense", -1): first of its name.
_COUNTED = re.compile(r"^(.*?)_(\d+)$")
# A dropout's random state (`seed_generator_3/seed_generator_state`): a
# fresh one draws other masks and loses nothing, so it need not pair.
SEED_STATE = "/seed_generator_state"
# The most places of names both made up and given that `pair_weights`
# tells apart, each by trying both (a model with more loads as Keras's
# load leaves it, and says what is lost).
_MOST_PLACES = 8


class Names(NamedTuple):
    """The names of a load (`names_made`)."""

    made: set  # those Keras made up (`dense_3`, for a layer without one)
    given: set  # those layers (or other `keras.Operation`s) were given
    made_up: dict  # id of each Operation made in the load -> whether
    # Keras made its name up


@contextlib.contextmanager
def names_made(names):
    """Adds to `names` (a `Names`) each name Keras makes up while the
    block runs, and each name a layer is given.

    Keras counts the names it makes up per class in a global attribute
    and writes the `n`-th as `dense_n` (the first as `dense`), so the
    counts before and after tell every name it made up in between. A
    name in both sets is one layer's own and another's made up: which is
    which, no path tells (`pair_weights`).
    """
    counts = private_import(
        "keras.src.backend.common.global_state",
        "get_global_attribute",
        "kmp.load_model of a checkpoint directory",
    )
    before = dict(counts("object_name_uids") or {})
    stock = keras.Operation.__init__

    def init(operation, name=None, *args, **kwargs):
        if name is not None:
            names.given.add(name)
        names.made_up[id(operation)] = name is None
        stock(operation, name, *args, **kwargs)

    keras.Operation.__init__ = init
    try:
        yield
    finally:
        keras.Operation.__init__ = stock
        for prefix, count in (counts("object_name_uids") or {}).items():
            for k in range(before.get(prefix, 0), count):
                names.made.add(prefix if k == 0 else f"{prefix}_{k}")


def ranked(paths, keeps=lambda raw, scope, part: False) -> dict:
    """`{path: ranked path}`: each part of each path written as its rank
    among the parts of `paths` in the same scope with the same name but
    for Keras's count, but for the parts that `keeps`, which stay as
    they are (and take no rank).

    Args:
        paths: variable paths (`"block/dense_2/kernel"`).
        keeps: `keeps(raw, scope, part)`: whether `part` keeps its name,
            where `raw` is the path of the scope it is in, and `scope`
            that path ranked.

    Example:

    ```python
    ranked(
        ["block/dense_1/kernel", "block/dense_2/kernel"],
        keeps=lambda raw, scope, part: part in ("block", "kernel"),
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
            if keeps("/".join(scope), ranks[scope], part):
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


def known_places(model, names) -> dict:
    """`{(scope, part): whether Keras made its name up}` for the parts of
    `model`'s variable paths whose layer the load made (`names.made_up`):
    a variable's innermost scope is its own layer's, each outer one the
    nearest layer of that name holding it."""
    parents, owners = {}, {}
    for layer in model._flatten_layers(include_self=True):
        for child in layer._flatten_layers(include_self=False, recursive=False):
            parents.setdefault(id(child), layer)
        for variable in layer.weights:  # the last, innermost, holds it
            owners[id(variable)] = layer
    found = {}
    for variable in model.weights:
        layer = owners.get(id(variable))
        places = _places(variable.path)[:-1]
        for place in reversed(places):
            while layer is not None and layer.name != place[1]:
                layer = parents.get(id(layer))
            if layer is None or id(layer) not in names.made_up:
                break
            made = names.made_up[id(layer)]
            if found.setdefault(place, made) != made:
                found[place] = None  # two layers: no telling
            layer = parents.get(id(layer))
    return {place: made for place, made in found.items() if made is not None}


def pair_weights(saved, variables, names=None, scope="", known=None) -> dict:
    """`{saved path: variable}` pairing every weight a run saved with the
    loaded model's variable of the same ranked path (`ranked`) and
    shape, or `{}` where one of either pairs with none or with several.

    The parts of the load's paths whose names Keras did not make up in
    the load (`names.made`) are kept as they are, on both sides. A name
    both made up and given in the load (a config's `dense` at the root,
    a made-up `dense` in a block) is one or the other at each place it
    is at: every choice is tried, and where two pair differently,
    nothing is paired.
    The run may have made its variables inside the model's own name
    scope (`fit` builds a subclassed or Sequential model so, a load does
    not: the run's `net/dense/kernel`, the load's `dense/kernel`): a
    saved path in `scope` (the model's name) is read without it. A
    dropout's random state pairs where it can, and need not.

    Args:
        saved: `{path: shape}` of the weights a checkpoint holds.
        variables: the loaded model's weights.
        names: the load's `Names` (`names_made`); none: every name
            made up.
        scope: the model's name.
        known: `known_places`: where it tells, whether a part's name was
            made up, whatever the strings.
    """
    inner = {
        p: p[len(scope) + 1 :] if scope and p.startswith(scope + "/") else p
        for p in saved
    }
    if len(set(inner.values())) < len(inner):
        return {}  # a path saved both in the model's scope and outside
    if names is None:  # every name made up
        return _pairs(saved, inner, variables, lambda raw, part: False)
    # Where a name was both made up and given, each place it is at is
    # one or the other: every choice is tried (up to 2 ** 8 of them).
    known = known or {}
    both = sorted(
        {
            (raw, part)
            for v in variables
            for raw, part in _places(v.path)
            if part in names.made
            and part in names.given
            and (raw, part) not in known
        }
    )
    if len(both) > _MOST_PLACES:
        return {}
    found = []
    for choice in itertools.product((False, True), repeat=len(both)):
        given = {place for place, kept in zip(both, choice) if kept}
        keeps = _keeps(names.made, given, known)
        pairs = _pairs(saved, inner, variables, keeps)
        if pairs and all(_ids(pairs) != _ids(other) for other in found):
            found.append(pairs)
    return found[0] if len(found) == 1 else {}


def _keeps(made, given, known):
    """Whether a load's part keeps its name: its layer's name was not
    made up (`known`), or else the name is not one made up, or given at
    that place (`(raw scope, part)` in `given`)."""

    def keeps(raw, part):
        if (raw, part) in known:
            return not known[raw, part]
        return part not in made or (raw, part) in given

    return keeps


def _ids(pairs):
    return {saved: id(variable) for saved, variable in pairs.items()}


def _places(path):
    """`(scope, part)` of each part of `path`."""
    parts = path.split("/")
    return [("/".join(parts[:i]), part) for i, part in enumerate(parts)]


def _pairs(saved, inner, variables, keeps) -> dict:
    """`pair_weights` where the load's parts that `keeps(raw scope, part)`
    keep their names: `inner` holds each saved path without the model's
    scope."""
    kept = set()

    def ours_keeps(raw, at, part):
        if not keeps(raw, part):
            return False
        kept.add((at, part))
        return True

    ours = ranked([v.path for v in variables], ours_keeps)
    # A part of the run's keeps its name where the load's at that ranked
    # path kept its own.
    ranks = ranked(list(inner.values()), lambda raw, *at: at in kept)
    by_rank = defaultdict(list)
    for path in inner:
        by_rank[ranks[inner[path]]].append(path)
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
