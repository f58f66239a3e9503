"""Reading a model's own code: a method's syntax tree, found through the
class's MRO, the methods of `self` it reaches and the user's functions
they call, to a fixed depth.

`train_step_checks` asks whether a `train_step` scales its loss, where
the scaling may sit in a helper method (of the class, or of a base class
of the user's); `dtype_checks` asks what a layer's `call` draws and what
a step concatenates. Both read; neither runs anything. What cannot be
read (a class typed into a console, a method made by `exec`) is said
so: the checks then say "cannot tell" rather than guess.
"""

import ast
import inspect
import textwrap
from typing import NamedTuple

from kmp import backend

# How many calls deep `reachable` follows `self.method(...)`.
DEPTH = 3


class Method(NamedTuple):
    """A method as found on a class.

    Attributes:
        owner: The class whose `__dict__` defines it.
        name: Its name.
        function: The function.
        tree: Its `ast.FunctionDef`, or None where there is no source to
            read.
    """

    owner: type
    name: str
    function: object
    tree: ast.AST | None

    @property
    def where(self) -> str:
        return f"{self.owner.__name__}.{self.name}"


def syntax_tree(function):
    """The `ast.FunctionDef` of a function, or None without a source."""
    try:
        source = textwrap.dedent(inspect.getsource(function))
        tree = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    if isinstance(tree, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return tree
    return None


def find_method(cls, name, after=None) -> Method | None:
    """`name` on `cls` through its MRO (from the class after `after`, for
    `super()`), or None where that is not a plain function."""
    mro = cls.__mro__
    if after is not None and after in mro:
        mro = mro[mro.index(after) + 1 :]
    for owner in mro:
        if name in owner.__dict__:
            function = owner.__dict__[name]
            function = getattr(function, "__func__", function)
            # A `tf.function`'s Python function (a decorated train step).
            function = getattr(function, "python_function", function)
            if not inspect.isfunction(function):
                return None
            return Method(owner, name, function, syntax_tree(function))
    return None


def _self_reads(tree):
    """`(name, via_super)` for each `self.name` and `super().name` the
    tree reads, called or passed on (`jax.value_and_grad(self.step)`)."""
    reads = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id == "self":
            reads.append((node.attr, False))
        elif (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "super"
        ):
            reads.append((node.attr, True))
    return reads


def reachable(cls, name, depth=DEPTH):
    """The method `name` of `cls` and the methods of `self` it reaches,
    each once, to `depth` calls deep. Methods of the user's classes are
    followed; a library's (Keras's `compute_loss`, its own `train_step`
    through `super()`) are listed but not followed.

    Returns:
        `(methods, deeper)`: the `Method`s, the first being `name`'s
        (none if `cls` has no such function), and whether methods past
        `depth` were left unread.
    """
    first = find_method(cls, name)
    if first is None:
        return [], False
    found, frontier, seen = [first], [first], {(first.owner, first.name)}
    for level in range(depth + 1):
        following = []
        for method in frontier:
            if method.tree is None or not backend.is_users(method.owner):
                continue  # a library's method is read, not followed
            for attribute, via_super in _self_reads(method.tree):
                after = method.owner if via_super else None
                reached = find_method(cls, attribute, after)
                if reached and (reached.owner, reached.name) not in seen:
                    seen.add((reached.owner, reached.name))
                    following.append(reached)
        if level == depth:
            return found, bool(following)
        found += following
        frontier = following


def names_of(method) -> dict:
    """What a method's free names refer to: its module's globals, and
    the variables of the functions it was made in (its closure)."""
    function = method.function
    names = dict(function.__globals__)
    for name, cell in zip(
        function.__code__.co_freevars, function.__closure__ or ()
    ):
        try:
            names[name] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    return names


def package_of(method, module) -> str:
    """The top package of the module a dotted name (`keras.random`,
    `tf.random`, `random` from `from keras import random`) resolves to
    in the method's globals or closure, or ''."""
    head, *rest = module.split(".")
    value = names_of(method).get(head)
    for part in rest:
        value = getattr(value, part, None)
    name = getattr(value, "__name__", "") if inspect.ismodule(value) else ""
    return name.split(".")[0]


def module_calls(method):
    """Yields `(node, name, package, function)` for each call of a
    function through a dotted name in a method (`keras.random.normal(
    ...)`, `tf.nn.softmax(...)`, `ops.cast(...)`): the call's node, its
    dotted name, the top package its module resolves to in the method's
    names (`package_of`, '' for none) and the function's name."""
    for node in ast.walk(method.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = dotted(node.func)
            module, _, function = name.rpartition(".")
            package = package_of(method, module) if module else ""
            yield node, name, package, function


def called_functions(method) -> list:
    """The user's functions (not methods) that a method calls by name,
    found in its globals and closure."""
    if method.tree is None:
        return []
    names = names_of(method)
    found = []
    for node in ast.walk(method.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            target = names.get(node.func.id)
            if (
                inspect.isfunction(target)
                and backend.is_users(target)
                and target not in found
            ):
                found.append(target)
    return found


def reached_functions(methods, depth=DEPTH):
    """The user's functions that `methods` call by name, and those that
    they call in turn, each once, to `depth` calls deep (a train step's
    `backward(opt, loss)` that calls `scaled(opt, loss)`).

    Returns:
        `(found, deeper)`: `(caller, function, tree)` for each function
        (`caller` the method's or function's name that calls it, `tree`
        None where there is no source), and whether functions past
        `depth` were left unread.
    """
    found, seen = [], set()
    frontier = [(m.where, f) for m in methods for f in called_functions(m)]
    for level in range(depth + 1):
        following = []
        for caller, function in frontier:
            if function in seen:
                continue
            seen.add(function)
            tree = syntax_tree(function)
            found.append((caller, function, tree))
            if tree is not None:
                reader = Method(None, function.__name__, function, tree)
                name = function.__qualname__
                following += [(name, f) for f in called_functions(reader)]
        following = [(c, f) for c, f in following if f not in seen]
        if level == depth:
            return found, bool(following)
        frontier = following
    return found, False


def dotted(node) -> str:
    """`a.b.c` for an attribute chain of names, else ''."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def first_in_calls(layers, find):
    """Yields `(layer, method, found)` for each of the user's layer
    classes among `layers` (its first layer): the first thing
    `find(method)` lists in the class's `call` or a method of `self` it
    reaches, where one lists any. A class is read once: a finding is
    said once for all its layers."""
    seen = set()
    for layer in layers:
        cls = type(layer)
        if cls in seen or not backend.is_users(cls):
            continue
        seen.add(cls)
        methods, _ = reachable(cls, "call")
        for method in methods:
            found = find(method) if method.tree is not None else []
            if found:
                yield layer, method, found[0]
                break
