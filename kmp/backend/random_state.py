"""The framework's own global random generator, which a backup keeps.

Keras draws its random numbers from `keras.random.SeedGenerator`s, whose
state is a variable of the layer, on every backend but one case: on
torch, a layer built without a seed (`keras.layers.Dropout(0.5)`) draws
from torch's global generator (Keras's torch `dropout` falls back to
`torch.nn.functional.dropout`). A backup that restores the weights and
the seed generators but not that generator resumes with other draws:
`kmp.app.backup` keeps its state per epoch with this module.

    random_state          the global generator's state (JSON-ready), or
                          None where Keras draws nothing from one
    restore_random_state  sets it back
"""

import base64

from kmp.backend import _current


def random_state():
    """The state of the generators Keras's unseeded draws use: on torch,
    the CPU generator's (and each CUDA device's), as base64 strings; on
    TensorFlow and JAX, None (their draws are all seed generators').

    Example:

    ```python
    state = backend.random_state()
    ...  # draws
    backend.restore_random_state(state)  # the same draws again
    ```
    """
    if _current.name() != "torch":
        return None
    import torch

    states = [torch.get_rng_state()]
    if torch.cuda.is_available():
        states += torch.cuda.get_rng_state_all()
    return [base64.b64encode(s.numpy().tobytes()).decode() for s in states]


def restore_random_state(state) -> None:
    """Sets the generators back to `state` (from `random_state`); None,
    or a state from another backend's run, changes nothing."""
    if not state or _current.name() != "torch":
        return
    import torch

    tensors = [
        torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)
        for s in state
    ]
    torch.set_rng_state(tensors[0])
    if len(tensors) > 1 and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(tensors[1:])
