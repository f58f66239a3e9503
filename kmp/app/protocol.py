"""What an example declares, so that the commands run it without knowing
it: `kmp train`, `kmp bench` and `kmp doctor` hold no per-example code.

An example is one module in `examples/` (installed as `kmp.examples`),
named as the example and registered by its settings class in
`kmp_config.configs.EXAMPLES` (name -> config class). Every example
declares:

    Config                   its settings (`kmp_config.configs`): the flags
    train(config)            trains, evaluates, saves; returns the results
                             (`kmp train`), its run in a
                             `kmp.app.run.Run`
    compile_model(config, steps)    the compiled model, in the current
                                    dtype policy (`--batch_size=max`
                                    compiles its step at each batch tried)
    bench_inputs(config, count)     `(model, x, y)`: the model, pinned and
                                    not compiled, and `count` synthetic
                                    examples for it

and the examples `kmp bench` and `kmp doctor` take
(`kmp_config.configs.CLASSIFIERS`) also:

    load_data(config)               the splits (`kmp.app.data.Splits`)
    make_datasets(splits, config)   `(train, test)` as `fit` takes them

What is data, not code, its `Config` declares (no Keras there):
`BENCH_SIZES` (`{"small": fields, "full": fields}`, its sizes on a CPU
and a GPU), `BENCH_FLOAT8` and `BENCH_OPTIMIZER` for `kmp bench`
(`CONFIG_CLASSIFIERS`), and `LAYOUT` for `--distribution=model` where it
has one (`kmp.app.scale_out.layout_map`).

A new example is its module, its config class in `EXAMPLES` and its
test file: `tests/app/protocol_test.py` holds every registered example
to this list.
"""

import importlib
import inspect

from kmp_config import configs

# Each name, and the number of arguments it takes (None: not a function).
EVERY_EXAMPLE = {
    "Config": None,
    "train": 1,
    "compile_model": 2,
    "bench_inputs": 2,
}
CLASSIFIERS = {
    "load_data": 1,
    "make_datasets": 2,
}
# What a classifier's Config declares for `kmp bench`.
CONFIG_CLASSIFIERS = ("BENCH_SIZES", "BENCH_FLOAT8", "BENCH_OPTIMIZER")


def declared(name) -> dict:
    """The names example `name` must declare, with their arities."""
    if name in configs.CLASSIFIERS:
        return {**EVERY_EXAMPLE, **CLASSIFIERS}
    return dict(EVERY_EXAMPLE)


def problems(name, module) -> list:
    """What `module`, registered as example `name`, fails to declare."""
    found = []
    for attribute, arity in declared(name).items():
        if not hasattr(module, attribute):
            found.append(f"declares no {attribute}")
            continue
        value = getattr(module, attribute)
        if arity is not None:
            required = [
                p
                for p in inspect.signature(value).parameters.values()
                if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
            if len(required) != arity:
                found.append(
                    f"{attribute} takes {len(required)} argument(s), not "
                    f"{arity}"
                )
    if getattr(module, "Config", None) is not configs.EXAMPLES.get(name):
        found.append(f"its Config is not configs.EXAMPLES[{name!r}]")
    elif name in configs.CLASSIFIERS:
        found += [
            f"its Config declares no {attribute}"
            for attribute in CONFIG_CLASSIFIERS
            if not hasattr(module.Config, attribute)
        ]
        sizes = getattr(module.Config, "BENCH_SIZES", None)
        if sizes is not None and set(sizes) != {"small", "full"}:
            found.append("its Config's BENCH_SIZES are not small and full")
    return found


def load_example(name):
    """The module of example `name`, checked against the protocol.

    Raises:
        TypeError: naming what the module fails to declare (a defect of
            the example, not of the user's input).
    """
    if name not in configs.EXAMPLES:
        raise KeyError(
            f"no example {name!r}; registered: {list(configs.EXAMPLES)}"
        )
    module = importlib.import_module(f"kmp.examples.{name}")
    found = problems(name, module)
    if found:
        raise TypeError(
            f"examples/{name}.py: "
            + "; ".join(found)
            + " (kmp.app.protocol lists what an example declares)."
        )
    return module
