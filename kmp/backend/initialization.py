"""Every new variable's first value from one compiled program (JAX).

Keras on JAX computes each variable's initial value when it creates the
variable, each initializer a small jitted program compiled per shape:
building the CIFAR-10 ResNet-9 compiles 14 of them, about 2 s of a cold
start on a 2-core CPU (the random ones, threefry and all, 0.2-0.4 s
each), for a job whose training step compiles once. Inside
`initialized_together()` Keras defers the values (a `StatelessScope`
that does not initialize); on leaving it, the values of every deferred
variable whose initializer is one of Keras's uniform or constant ones
with a fixed seed (what `keras.utils.set_random_seed` gives them: the
defaults of Dense, Conv, Embedding, attention, normalization and the
optimizers' slots) are computed in one program, compiled at XLA's
optimization level 0 (it runs once: about 0.3 s to compile the
ResNet-9's here, against 1.75 s at the default level), and handed to
Keras's own deferred initialization.

The values are Keras's to within one unit in the last place of each
tensor's largest value, not to the bit: XLA's CPU compiler rounds
`x * (max - min) + min` differently in one program at level 0 than in
Keras's per-shape programs (about a quarter of the ResNet-9's values
differ, each by at most that unit; at the default level the values
matched in some processes and not in others, so no level promises bits).
Two runs with the same seed start from the same values, to the bit
(`tests/backend/initialization_test.py` checks both, each build in a
fresh process). Normal initializers go through erfinv's polynomial,
where more roundings could move, so Keras computes those itself, as it
does any variable the distribution in force shards (its own sharded
initialization) and any other initializer (orthogonal, a function, a
seed generator).
Elsewhere than JAX the block changes nothing: TensorFlow and torch
initialize eagerly, without compiling.
"""

import contextlib

import keras

from kmp.backend._current import name

# Once-run code: compile time, not run time, is what counts.
_OPTIONS = {"xla_backend_optimization_level": 0}


def _deferred():
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute("uninitialized_variables") or []


def _fixed(initializer) -> bool:
    """Keras's own uniform or constant initializer, with nothing drawn
    from a seed generator when it runs (a random one holds an integer
    seed): those one program gives to within 1 ulp of the largest."""
    from keras import initializers

    if isinstance(initializer, (initializers.Zeros, initializers.Ones)):
        return True
    if isinstance(initializer, initializers.Constant):
        return True
    uniform = isinstance(initializer, initializers.RandomUniform) or (
        isinstance(initializer, initializers.VarianceScaling)
        and initializer.distribution == "uniform"
    )
    return uniform and isinstance(initializer.seed, int)


def _replicated(variable) -> bool:
    distribution = keras.distribution.distribution()
    if distribution is None:
        return True
    layout = distribution.get_variable_layout(variable)
    return all(axis is None for axis in getattr(layout, "axes", ()) or ())


@contextlib.contextmanager
def initialized_together():
    """Variables made inside the block get their first values from one
    compiled program when it ends (JAX; see the module's docstring).

    Nothing inside the block may read a new variable's value, or make a
    variable from a value rather than an initializer (Keras refuses both
    in a `StatelessScope`): build models there; train, save and convert
    after it. A KerasHub task compiles itself in its constructor, which
    makes its optimizer's variables from values: build its backbone in
    the block and the task after it.

    Example:

    ```python
    with backend.initialized_together():
        model = build_model()
    ```
    """
    from keras.src.backend.common.stateless_scope import in_stateless_scope

    if name() != "jax" or in_stateless_scope() or _deferred():
        yield  # not JAX, or someone else defers: leave it to them
        return
    import jax
    from keras.src.backend.common import variables

    together, saved = [], []
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
        together = [
            v for v in _deferred() if _fixed(v._initializer) and _replicated(v)
        ]
        if together:

            def initial_values():  # the program's name in JAX's logs
                return [
                    v._initializer(v._shape, dtype=v._dtype) for v in together
                ]

            program = jax.jit(initial_values)
            values = program.lower().compile(compiler_options=_OPTIONS)()
            saved = [v._initializer for v in together]
            for variable, value in zip(together, values):
                variable._initializer = _Value(value)
    finally:
        try:
            variables.initialize_all_variables()  # Keras's, with our values
        finally:
            for variable, initializer in zip(together, saved):
                variable._initializer = initializer


class _Value:
    """An initializer that returns a value computed already."""

    def __init__(self, value):
        self.value = value

    def __call__(self, shape, dtype=None):
        return self.value
