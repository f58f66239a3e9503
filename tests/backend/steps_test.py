"""What a training step does differently per backend
(`kmp.backend.steps`): extra logs read inside the step, what compiles it,
crossentropy's logits path. Gradients by intermediate tensors:
taped_gradients_test.py."""

import keras
import numpy as np

from kmp import backend


def test_add_train_step_logs_wraps_once():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    backend.add_train_step_logs(model, lambda read: {})
    wrapped = model.train_step
    backend.add_train_step_logs(model, lambda read: {})
    assert model.train_step is wrapped


def test_extra_logs_read_values_after_the_step_s_update():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    counter = model.optimizer.iterations
    backend.add_train_step_logs(
        model, lambda read: {"iterations": read(counter)}
    )
    history = model.fit(
        np.ones((4, 2)), np.ones((4, 1)), batch_size=2, epochs=2, verbose=0
    )
    # Read after each step's update: 2 steps per epoch, so 2 then 4.
    assert history.history["iterations"] == [2.0, 4.0]


def test_step_compiler_and_the_logits_path_follow_the_backend():
    torch = backend.name() == "torch"
    assert backend.step_compiler() == ("torch.compile" if torch else "XLA")
    probabilities = keras.layers.Activation("softmax")(
        keras.ops.convert_to_tensor([[0.0, -30.0]])
    )
    loss = float(
        keras.losses.sparse_categorical_crossentropy(
            np.array([1]), probabilities
        )[0]
    )
    # With the logits path the loss is the true 30; without it, Keras
    # clips the probability to 1e-7: -log(1e-7) = 16.1.
    expected = 30.0 if backend.crossentropy_reads_logits() else 16.118
    assert abs(loss - expected) < 0.01


def test_uncompiled_is_dynamo_s_disable_on_torch_only():
    def decide():
        return True

    run = backend.uncompiled(decide)
    assert run() is True
    if backend.name() != "torch":
        assert run is decide
        return
    import torch

    # Called inside a compiled function, it runs as Python (a graph
    # break), not traced: it does not see the compiler.
    seen = []

    def compiling():
        seen.append(torch.compiler.is_compiling())
        return 2.0

    @torch.compile(backend="eager")
    def traced(x):
        return x * compiling()

    @torch.compile(backend="eager")
    def called(x):
        return x * run_as_python()

    run_as_python = backend.uncompiled(compiling)
    assert float(traced(torch.ones(()))) == 2.0
    assert float(called(torch.ones(()))) == 2.0
    assert seen == [True, False]
