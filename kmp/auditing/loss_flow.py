"""Which held model's outputs each crossentropy of a trainer's step reads,
from the step's source.

A trainer of models it holds (keras-io's VAE, its GANs) applies its loss
to their outputs in its `train_step`; Keras records no link between the
two. keras-io's DCGAN holds a `BinaryCrossentropy()` as `self.loss_fn`
and applies it to its discriminator's float16 sigmoid, an error under a
loss scale (`loss_checks.probabilities_finding`); its generator's
sigmoid images reach the loss only through the discriminator, which
reads them as any layer reads its input. The guide's GAN applies
`BinaryCrossentropy(from_logits=True)` to logits.

`trainer_losses` reads the step, the methods of `self` it reaches and
the user's functions they call (`source_reading`), each statement in
source order:

- a name holds the held models whose outputs its value carries. A held
  model's call (`self.discriminator(x)`, its `stateless_call`, `call` or
  `__call__`, or through a name bound to the model) carries its own
  output alone: the discriminator's scores of the generator's images
  are the discriminator's. A library's function, a loss or a value's
  method (`fake.detach()`) carries what its arguments carry. A call of
  the user's own (`self.discriminate(fake)`) or one the step does not
  resolve (`nets["d"](fake)`) may return any held model's output. Any
  other expression carries what its parts carry. An assignment
  replaces what a name held, unless it sits in a branch or a loop; a
  tuple of values is matched to a tuple of names one by one;
  `self.x = ...` binds no name. A multi-output held model's outputs
  are told apart where the step unpacks its call's result
  (`validity, images = self.combined(z)`) or takes a constant
  subscript of it (`out[0]`, `out[-1]`, a dict's `out["validity"]`):
  each name, or the subscript, carries that output alone
  (`held_outputs`); any other part of the result (`out[i]`, a slice,
  `ops.stack(out)[0]`) carries every output;
- a crossentropy that reads probabilities reads the models its
  prediction carries: a Keras loss's `y_pred` (its second argument), a
  torch function's `input` (its first), any argument of another's;
- one whose prediction carries no held model (a helper's parameter, a
  user's function), or may carry any, counts for every held model, as
  the audit did before it read the flow: a missed error is worse than
  a needless one. A step whose source cannot be read (a class made by
  `exec`), or that is too deep to walk, counts nothing, and a sigmoid
  output is then a warning ("not known yet").

What reads probabilities: a Keras crossentropy without `from_logits`,
torch's `binary_cross_entropy` and `BCELoss`; neither a loss given
logits (`from_logits=True`, `..._with_logits`, optax's) nor torch's
`cross_entropy`, which takes logits. A `for` or comprehension target
binds nothing; an `import` in the step binds the module imported
already (`sys.modules`), importing nothing.
"""

import ast
import functools
import re
import sys
from typing import NamedTuple

import keras

from kmp import model_layers
from kmp.auditing import held_outputs
from kmp.auditing import source_reading
from kmp.auditing.loss_checks import names_of_losses

# A held model's methods that run it as its call does.
_MODEL_CALLS = ("call", "stateless_call", "__call__")
# What a value holds where a call the step makes is the user's own (a
# helper method's result): any held model's output, for all kmp knows.
_ANY = "*"
# Libraries whose functions return what their arguments carry.
_LIBRARIES = (
    "builtins",
    "jax",
    "jaxlib",
    "keras",
    "math",
    "numpy",
    "tensorflow",
    "torch",
)
# Statements that may run their body or not, or twice: a name bound in
# one keeps what it held before, too.
_BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.Match)
# Packages whose crossentropies all take logits.
_LOGITS_PACKAGES = ("optax",)
# torch's crossentropies that take probabilities, `_` and case dropped.
_TORCH_PROBABILITIES = ("binarycrossentropy", "bceloss")


def trainer_losses(trainer) -> dict:
    """The crossentropies a trainer of models it holds applies to each
    held model's outputs, by the held model's name (`model_layers.
    held_models`), read from its `train_step` (the module's docstring
    says how): `{"decoder": ["binary_crossentropy"]}` for keras-io's
    VAE. A crossentropy on one output of a multi-output held model is
    keyed by that output (`held_outputs.output_key`):
    `{"combined/validity": [...]}`. A held model no crossentropy reads
    is absent; empty where the step cannot be read."""
    held = model_layers.held_models(trainer)
    models = dict(held)
    methods, _ = source_reading.reachable(type(trainer), "train_step")
    readers = [method for method in methods if method.tree is not None]
    functions, _ = source_reading.reached_functions(readers)
    readers += [
        source_reading.Method(None, function.__name__, function, tree)
        for _, function, tree in functions
        if tree is not None
    ]
    found = {}
    for reader in readers:
        step = _Step(trainer, held, source_reading.names_of(reader))
        try:
            step.visit(reader.tree)
        except RecursionError:  # an expression too deep to walk: unread
            continue
        for loss, carried in step.reads:
            untraced = not carried or _ANY in carried
            keys = {
                key
                for each in carried
                for key in held_outputs.result_keys(each, models)
            }
            for name in list(models) if untraced else sorted(keys):
                names = found.setdefault(name, [])
                if loss not in names:
                    names.append(loss)
    return found


def _attribute(owner, name):
    """`getattr(owner, name)`, None where reading it raises (a property
    of the user's)."""
    try:
        return getattr(owner, name, None)
    except Exception:
        return None


class _Step(ast.NodeVisitor):
    """One method's or function's statements, in source order: what each
    name holds, and `reads`, `(loss, carried)` for each crossentropy call
    (`carried` empty where its prediction carries no held model)."""

    def __init__(self, trainer, held, names):
        self.trainer, self.names = trainer, names
        self.held = {id(model): name for name, model in held}
        self.by_name = dict(held)
        # A name: what its value carries, each a held model's name (its
        # every output), or `held_outputs.Outputs`.
        self.holds = {}
        self.bound = {}  # a name: the object it was bound to (an alias)
        self.reads = []
        self.branches = 0  # how deep in `_BRANCHES` the walk is

    def visit(self, node):
        if not isinstance(node, _BRANCHES):
            return super().visit(node)
        self.branches += 1
        try:
            return super().visit(node)
        finally:
            self.branches -= 1

    def visit_Assign(self, node):
        self.visit(node.value)
        for target in node.targets:
            self._bind(target, node.value)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)
            self._bind(node.target, node.value)

    def visit_AugAssign(self, node):
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            name = node.target.id
            held = self.holds.get(name, frozenset())
            carried = held | self.models(node.value)
            self.holds[name] = held_outputs.widened(carried)

    def visit_NamedExpr(self, node):
        self.visit(node.value)
        self._bind(node.target, node.value)

    def visit_Import(self, node):
        # `import torch.nn.functional as F` inside the step: the module
        # as imported already (nothing is imported here).
        for alias in node.names:
            if alias.asname:
                module = sys.modules.get(alias.name)
            else:
                module = sys.modules.get(alias.name.split(".")[0])
            if module is not None:
                self.bound[alias.asname or alias.name.split(".")[0]] = module

    def visit_ImportFrom(self, node):
        module = sys.modules.get(node.module or "")
        for alias in node.names:
            found = _attribute(module, alias.name)
            if found is not None:
                self.bound[alias.asname or alias.name] = found

    def visit_Call(self, node):
        try:
            described = self._crossentropy(node)
        except Exception:  # a user's object that raises when read
            described = None
        if described is not None:
            loss, prediction = described
            models = set().union(set(), *map(self.models, prediction))
            self.reads.append((loss, models))
        self.generic_visit(node)

    def _bind(self, target, value, carried=None):
        """Binds `target` to `value`, or to the part of it that carries
        `carried`, where given (a name that unpacks it)."""
        if isinstance(target, ast.Name):
            bound = None
            if carried is None:
                carried = self.models(value)
                bound = self._object(value) or self._built(value)
            if self.branches:  # bound maybe: what it held may be left
                carried |= self.holds.get(target.id, frozenset())
            self.holds[target.id] = carried
            if bound is not None:
                self.bound[target.id] = bound
            else:
                self.bound.pop(target.id, None)
        elif isinstance(target, ast.Starred):
            self._bind(target.value, value, carried)
        elif isinstance(target, (ast.Tuple, ast.List)):
            given = (
                value.elts if isinstance(value, (ast.Tuple, ast.List)) else ()
            )
            starred = any(
                isinstance(e, ast.Starred) for e in (*target.elts, *given)
            )
            paired = len(given) == len(target.elts) and not starred
            if paired and carried is None:
                for each, part in zip(target.elts, given):
                    self._bind(each, part)
                return
            # `z_mean, z_log_var, z = self.encoder(x)`: one output each.
            carried = self.models(value) if carried is None else carried
            for at, each in enumerate(target.elts):
                at = None if starred else at  # a starred name: every one
                part = held_outputs.part(
                    carried, at, self.by_name, len(target.elts)
                )
                self._bind(each, value, part)
        # `self.x = ...` or `a[i] = ...`: no name is bound.

    def models(self, node) -> frozenset:
        """What an expression carries: held models' names (their every
        output; `_ANY` where a call of the user's own may return any
        model's) and `held_outputs.Outputs`."""
        model = self._called_model(node)
        if model is not None:
            if getattr(node.func, "attr", None) == "stateless_call":
                # `(outputs, variables)`: no output is told apart.
                return frozenset([model])
            return frozenset([held_outputs.Outputs(model, None)])
        if isinstance(node, ast.Name):
            return self.holds.get(node.id, frozenset())
        key = None
        if isinstance(node, ast.Subscript):
            key = held_outputs.constant(node.slice)
        if key is not None:  # `out[0]`
            carried = self.models(node.value)
            return held_outputs.part(carried, key, self.by_name)
        parts = frozenset().union(*map(self.models, ast.iter_child_nodes(node)))
        parts = held_outputs.widened(parts)
        if isinstance(node, ast.Call) and not self._passes_on(node.func):
            return parts | {_ANY}
        return parts

    def _passes_on(self, func) -> bool:
        """Whether a call returns what its arguments carry and no held
        model's output of its own: a library's function
        (`ops.concatenate`), a loss, a value's method (`fake.detach()`);
        not a method or function of the user's (`self.discriminate(x)`
        may return a held model's output), nor what the step cannot
        resolve (`nets["d"](x)`, `getattr(self, "d")(x)`)."""
        target = self._resolve(func)
        if target is None:
            # `value.method(...)`, unless the value is `self`.
            return isinstance(func, ast.Attribute) and not (
                isinstance(func.value, ast.Name) and func.value.id == "self"
            )
        if isinstance(target, (keras.losses.Loss, type)):
            return True
        module = _attribute(target, "__module__")
        if not isinstance(module, str):
            module = _attribute(type(target), "__module__") or ""
        return module.split(".")[0] in _LIBRARIES

    def _called_model(self, node):
        if not isinstance(node, ast.Call):
            return None
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _MODEL_CALLS:
            func = func.value
        callee = self._object(func)
        return None if callee is None else self.held.get(id(callee))

    def _object(self, node):
        """What a name bound here (`disc = self.discriminator`) or an
        attribute of `self` is; None for anything else."""
        if isinstance(node, ast.Name):
            return self.bound.get(node.id)
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            return _attribute(self.trainer, node.attr)
        return None

    def _built(self, node):
        """A loss a call builds (`keras.losses.BinaryCrossentropy()`),
        as `_Built`; None for any other value."""
        if not isinstance(node, ast.Call):
            return None
        cls = self._resolve(node.func)
        if not isinstance(cls, type):
            return None
        return _Built(cls, tuple(node.keywords))

    def _resolve(self, func):
        """The object a call's function names: a name bound here, an
        attribute of `self`, a global or closure variable, a dotted name
        through a module; None where it is none of them."""
        found = self._object(func)
        if found is not None:
            return found
        name = source_reading.dotted(func)
        if not name or name.startswith("self."):
            return None
        head, *rest = name.split(".")
        found = self.bound.get(head, self.names.get(head))
        for part in rest:
            found = _attribute(found, part)
        return found

    def _crossentropy(self, node):
        """`(loss name, prediction argument nodes)` for a call of a
        crossentropy that reads probabilities, else None."""
        keywords = list(node.keywords)
        if isinstance(node.func, ast.Call):  # built and called at once
            target = self._built(node.func)
        else:
            target = self._resolve(node.func)
            if isinstance(target, type):
                return None  # a loss built, not called
        if target is None:
            return None
        if isinstance(target, _Built):
            keywords += target.keywords
            target = target.cls
        name, logits, package = _describe(target)
        logits = logits or any(
            k.arg == "from_logits"
            and not (isinstance(k.value, ast.Constant) and not k.value.value)
            for k in keywords
        )
        if not _reads_probabilities(name, logits, package):
            return None
        return name, _prediction(node, package)


def _reads_probabilities(name, logits, package) -> bool:
    """Whether a loss so named reads probabilities (the module's
    docstring lists which)."""
    if not name or logits or package in _LOGITS_PACKAGES:
        return False
    flat = name.lower().replace("_", "")
    if "withlogits" in flat:
        return False
    if package == "torch":
        return flat in _TORCH_PROBABILITIES
    return "crossentropy" in flat


class _Built(NamedTuple):
    """A loss built in the step: its class, and the keywords it was
    built with (`from_logits=True`)."""

    cls: type
    keywords: tuple


def _describe(target):
    """`(name, from_logits, package)` of a loss: a Keras `Loss`, a
    function, a `functools.partial`, a class or an instance of one (a
    torch `BCELoss()`); `(None, False, "")` where it has no name."""
    if isinstance(target, keras.losses.Loss):
        logits = _attribute(target, "from_logits")
        if logits is None:
            try:
                ((_, logits),) = names_of_losses([target])
            except Exception:  # a `get_config` that raises
                logits = False
        return target.name, bool(logits), "keras"
    if isinstance(target, functools.partial):
        logits = target.keywords.get("from_logits", False)
        target = target.func
    else:
        logits = False
    if not (callable(target) or isinstance(target, type)):
        return None, False, ""
    named = isinstance(target, type) or _attribute(target, "__name__")
    kind = target if named else type(target)
    name = _attribute(kind, "__name__")
    if not isinstance(name, str) or name == "<lambda>":
        return None, False, ""
    package = str(_attribute(kind, "__module__") or "").split(".")[0]
    if isinstance(target, type) and issubclass(target, keras.losses.Loss):
        # Its instances' default name: `BinaryCrossentropy`'s is
        # "binary_crossentropy".
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
        package = "keras"
    return name, bool(logits), package


def _prediction(node, package):
    """A crossentropy call's prediction: a Keras loss's `y_pred` (second
    argument), a torch function's `input` (first); every argument of
    another's, or where that one is not there."""
    at, keyword = {"keras": (1, "y_pred"), "torch": (0, "input")}.get(
        package, (None, None)
    )
    if at is not None:
        for k in node.keywords:
            if k.arg == keyword:
                return [k.value]
        if len(node.args) > at and not any(
            isinstance(a, ast.Starred) for a in node.args[: at + 1]
        ):
            return [node.args[at]]
    return [*node.args, *(k.value for k in node.keywords)]
