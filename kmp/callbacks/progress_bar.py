"""`ProgressBar`: Keras's progress bar, without making `fit` wait for
each step's logs."""

import threading

import keras


class ProgressBar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar, without making `fit` wait for each step.

    Keras's `CallbackList` waits for every step's logs on the main thread,
    before it starts the next step, while any callback has a batch-end
    method and does not say `async_safe = True`; its own progress bar is
    one. On a GPU the host's work between steps (the next batch, the
    call) then leaves the device idle. Given this bar (in place of the
    one `fit` would add), and with every other callback async-safe (as
    `LossScaleMonitor` is), Keras on JAX and torch reads the logs on its
    own threads and starts the next step at once (TensorFlow's Keras
    always waits). A batch end that arrives after a later one's is not
    drawn: the bar never steps back.

    Example:

    ```python
    model.fit(
        x, y, epochs=3,
        callbacks=[kmp.callbacks.LossScaleMonitor(),
                   kmp.callbacks.ProgressBar()],
    )
    ```
    """

    # Batch ends may arrive on Keras's threads, a few at a time and out
    # of order.
    async_safe = True

    def __init__(self):
        super().__init__()
        self._draw_lock = threading.Lock()
        self._drawn = -1

    def on_epoch_begin(self, epoch, logs=None):
        self._drawn = -1
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        with self._draw_lock:
            if batch <= self._drawn:
                return
            self._drawn = batch
            super().on_train_batch_end(batch, logs)
