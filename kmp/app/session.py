"""One training run of an example, done once for every example: the
engine under their `train`.

Each example's `train` shows its own data, model and `model.fit`; around
them a run always does the same things, in the same order, and
`Session` does them:

    entering     checks the config; joins the JAX processes; turns the
                 compile cache on; seeds; makes the tf.distribute
                 strategy or the keras.distribution; enters the dtype
                 policy (`kmp.policy_scope`)
    start        given the splits: the backup a rerun resumes from (one
                 of other settings is refused here, before anything is
                 built), the callbacks, the steps of an epoch and of
                 validation
    scope        where the model is built (the strategy's scope)
    distribute   `kmp.distribute` under a strategy
    feed         `fit`'s training data: this process's share, as `fit`
                 takes it (a dataset, or arrays with their batch size)
    validation   the same for validation data
    results      the run's record; `save` writes it, the model and the
                 plot (chief only)

Each example's `train` is the use: `examples/cifar10.py` reads

```python
with Session(config, "cifar10", layouts=layout_map(config)) as session:
    splits = load_data(config)
    ...                                  # its datasets, then
    session.start(splits)
    with session.scope():
        model = compile_model(config, session.steps)
    history = session.distribute(model).fit(**session.feed(data), ...)
```
"""

import keras

import kmp
from kmp.app import recipes
from kmp.app import scale_out


class Session:
    """The run of one example; a context manager (see the module).

    Args:
        config: The run's config (`kmp_config.configs.RunConfig`).
        example: The example's name (`cifar10`): the saved model's file,
            `{example}.keras`.
        layouts: For `--distribution=model`, a function of the mesh
            giving the example's `keras.distribution.LayoutMap`.
        strategies: Whether the example runs under a `tf.distribute`
            strategy; without, `--strategy` other than none is refused.
    """

    def __init__(self, config, example, layouts=None, strategies=True):
        config.check()
        if not strategies and config.strategy != "none":
            raise kmp.InputError(
                f"strategy={config.strategy}: the {example} example runs "
                "on one device, or on JAX under --distribution=data."
            )
        self.config, self.example, self.layouts = config, example, layouts
        self.strategy = None
        self.run = None
        self._policy = None

    def __enter__(self):
        config = self.config
        scale_out.start_processes(config)  # many JAX processes: join first
        recipes.use_compile_cache(config)  # a rerun loads its compiled steps
        keras.utils.set_random_seed(config.seed)
        self.strategy = scale_out.make_strategy(config.strategy)
        scale_out.make_distribution(config, self.layouts)  # JAX
        self._policy = kmp.policy_scope(config.policy, config.master_weights)
        self.policy = self._policy.__enter__().name
        return self

    def __exit__(self, *exc_info):
        return self._policy.__exit__(*exc_info)

    def start(self, splits):
        """The backup a rerun resumes from, the callbacks, and the steps
        of an epoch (`steps`) and of validation (`eval_steps`)."""
        self.splits = splits
        self.run = recipes.Run(self.config, splits, self.strategy, self.policy)
        self.steps = self.config.steps or recipes.split_size(splits.train) // (
            self.config.batch_size
        )

    @property
    def callbacks(self):
        """Loss-scale monitor, step log, validation progress, backup."""
        return self._started().callbacks

    @property
    def eval_steps(self):
        """Validation batches: `--eval_steps`, the share `--steps` is of
        an epoch, or all (`None`)."""
        return self._started().eval_steps

    def scope(self):
        """Where to build and compile the model: the strategy's scope."""
        return scale_out.scope(self.strategy)

    def distribute(self, model):
        """`kmp.distribute(model)` under a strategy; else the model."""
        scale_out.prepare(model, self.strategy)
        return model

    def feed(self, data):
        """`fit`'s training arguments for `data` (a batched dataset, or
        an `(x, y)` pair of arrays): this process's share, with the
        batch size arrays need."""
        args, kwargs = recipes.fit_data(data, self.config.batch_size)
        return {**dict(zip(("x", "y"), args)), **kwargs}

    def validation(self, data):
        """Validation data: this process's share."""
        return scale_out.process_share(data, self.config.batch_size)

    def results(self, model, history, model_name):
        """The run's record (`recipes.Run.results`)."""
        return self._started().results(model_name, history, model)

    def save(self, model, results):
        """Writes `{example}.keras`, `results.json` and `results.png`."""
        self._started().save(model, results, self.example)

    def _started(self):
        if self.run is None:
            raise RuntimeError("Session.start(splits) comes before fit.")
        return self.run
