"""What reads a model's outputs: the losses it was compiled with, or the
crossentropies a trainer of models applies to them (keras-io's VAE, a
GAN), and what a 16-bit probability output means for them.
"""

import ast
import functools

import keras

from kmp import backend
from kmp import model_layers
from kmp.auditing import source_reading
from kmp.islands import activation_name


def probabilities_finding(layer, names, where):
    """A 16-bit softmax or sigmoid output: an error under a crossentropy
    (or a softmax's loss not known yet), a warning under a compiled loss
    that is none (a siamese network's contrastive loss, mse), or a
    sigmoid's not known yet (a GAN's generator, whose sigmoid makes
    images: a helper's DCGAN, 2026-11-30)."""
    dtype, activation = layer.compute_dtype, activation_name(layer)
    fix = "kmp.pin_float32(model), or dtype='float32' on this layer."
    if not names and activation == "sigmoid":
        names = ["not known yet: an error under a cross entropy"]
    if not names or any("crossentropy" in name.lower() for name in names):
        logits = backend.crossentropy_reads_logits()
        if dtype == "float16":
            problem = (
                "crossentropy's gradient reaches it as scale / (batch * p) "
                "for a true class of probability p, past float16's 65504 "
                "while that class is unlikely, so steps are skipped until "
                "the loss scale falls (p = 1.2e-4, batch 8: 5 of 5 skipped, "
                "where float32 trains)"
            )
        else:
            problem = f"the loss sees probabilities rounded to {dtype}"
        if logits:
            problem += (
                ", and it loses Keras's logits path (logits [0, -30] give "
                "a crossentropy of 16.1 instead of 30)"
            )
        return (
            "error" if dtype == "float16" or logits else "warning",
            where,
            f"Model output is a {dtype} {activation}: {problem}.",
            fix,
        )
    return (
        "warning",
        where,
        f"Model output is a {dtype} {activation}: the loss "
        f"({', '.join(names)}) reads probabilities rounded to {dtype}.",
        fix,
    )


def loss_names(model) -> list:
    """`(name, from_logits)` for each loss the model was compiled with:
    a name, a `keras.losses.Loss`'s name, a function's `__name__` (a
    `functools.partial`'s function's, its `from_logits` read); empty for
    a model not compiled with one. A callable without a name is left
    out."""
    return _names_of(keras.tree.flatten(getattr(model, "loss", None)))


def _names_of(items) -> list:
    names = []
    for item in items:
        if isinstance(item, str):
            names.append((item, False))
        elif isinstance(item, keras.losses.Loss):
            config = item.get_config()
            names.append((item.name, config.get("from_logits", False)))
        elif isinstance(item, functools.partial):
            name = getattr(item.func, "__name__", None)
            if name is not None:
                logits = item.keywords.get("from_logits", False)
                names.append((name, logits))
        elif callable(item) and hasattr(item, "__name__"):
            names.append((item.__name__, False))
    return names


def trainer_losses(trainer) -> dict:
    """The crossentropies a trainer of models it holds applies to each
    held model's outputs in its `train_step` (and the methods of its own
    that reaches), by the held model's name: keras-io's VAE's
    `keras.losses.binary_crossentropy` on its decoder's sigmoid, its
    DCGAN's `loss_fn` on its discriminator's. Read from the source: what
    a held model's call returns, and the names it is assigned to, flow
    into a loss call's arguments. A held model's output that only another
    held model takes (a GAN's generator's images) reaches no loss, and a
    crossentropy given `from_logits=True` reads logits, not
    probabilities: neither counts. A model the step's source does not
    show a crossentropy reading is absent."""
    held = {
        id(model): name for name, model in model_layers.held_models(trainer)
    }
    found = {}
    methods, _ = source_reading.reachable(type(trainer), "train_step")
    for method in methods:
        if method.tree is None:
            continue
        flow = _Flow(trainer, held, source_reading.names_of(method))
        flow.follow(method.tree)
        for node in ast.walk(method.tree):
            loss = flow.crossentropy(node)
            if loss is None:
                continue
            arguments = [*node.args, *(k.value for k in node.keywords)]
            for name in set().union(*map(flow.models, arguments)):
                found.setdefault(name, [])
                if loss not in found[name]:
                    found[name].append(loss)
    return found


class _Flow:
    """Which held models' outputs each name of a method holds."""

    def __init__(self, trainer, held, names):
        self.trainer, self.held, self.names = trainer, held, names
        self.holds = {}  # a local name: the held models' names in it

    def follow(self, tree):
        # The assignments, until no name learns of another model: their
        # order is not read, so a name reused for two models holds both.
        assignments = [
            node
            for node in ast.walk(tree)
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
            and node.value is not None
        ]
        changed = True
        while changed:
            changed = False
            for node in assignments:
                models = self.models(node.value)
                targets = getattr(node, "targets", None) or [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name) and not models <= (
                            self.holds.get(name.id, set())
                        ):
                            self.holds.setdefault(name.id, set()).update(models)
                            changed = True

    def models(self, node) -> set:
        """The held models whose outputs an expression carries: a held
        model's call gives its own alone (the discriminator's scores of
        the generator's images are the discriminator's)."""
        model = self._called_model(node)
        if model is not None:
            return {model}
        if isinstance(node, ast.Name):
            return set(self.holds.get(node.id, ()))
        return set().union(set(), *map(self.models, ast.iter_child_nodes(node)))

    def _called_model(self, node):
        # `self.discriminator(x)`, or its `stateless_call(...)` (keras-io's
        # JAX GAN).
        if not isinstance(node, ast.Call):
            return None
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "stateless_call":
            func = func.value
        if source_reading.dotted(func).count(".") != 1:
            return None
        owner, attribute = source_reading.dotted(func).split(".")
        if owner != "self":
            return None
        return self.held.get(id(getattr(self.trainer, attribute, None)))

    def crossentropy(self, node):
        """The name of the crossentropy a call node calls on
        probabilities, or None: a function named so
        (`keras.losses.binary_crossentropy`), or a loss the trainer
        holds (`self.loss_fn`) or its module or closure does."""
        if not isinstance(node, ast.Call):
            return None
        logits = any(
            k.arg == "from_logits"
            and not (isinstance(k.value, ast.Constant) and not k.value.value)
            for k in node.keywords
        )
        name = source_reading.dotted(node.func)
        owner, _, attribute = name.rpartition(".")
        if owner == "self":
            target = getattr(self.trainer, attribute, None)
        elif not owner and name:
            target = self.names.get(name)
        else:
            target = None
        if target is not None:  # a Loss, a function, a partial
            named = _names_of([target])
            if not named:
                return None
            ((found, held_logits),) = named
            logits = logits or held_logits
        elif name:  # a library's function through its module
            found = attribute
        else:
            return None
        if "crossentropy" not in found.lower() or logits:
            return None
        return found
