"""What reads a model's outputs: the losses it was compiled with (a
trainer's crossentropies are `loss_flow`'s), and what a 16-bit
probability output means for them.
"""

import functools

import keras

from kmp import backend
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
    return names_of_losses(keras.tree.flatten(getattr(model, "loss", None)))


def names_of_losses(items) -> list:
    """`(name, from_logits)` for each of `items`, as `loss_names` reads
    them."""
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
