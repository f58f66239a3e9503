"""kmp.callbacks.ProgressBar: Keras's bar, async-safe, never drawing an
older batch after a newer one."""

import keras
import pytest

import kmp


@pytest.mark.backend_independent
def test_the_progress_bar_never_steps_back(monkeypatch):
    drawn = []
    monkeypatch.setattr(
        keras.callbacks.ProgbarLogger,
        "on_train_batch_end",
        lambda self, batch, logs=None: drawn.append(batch),
    )
    bar = kmp.callbacks.ProgressBar()
    for batch in (0, 2, 1, 3):
        bar.on_train_batch_end(batch, {})
    assert drawn == [0, 2, 3]
    assert kmp.callbacks.ProgressBar.async_safe
