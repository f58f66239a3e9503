"""kmp.distribute's fit, predict and evaluate under a one-device
MirroredStrategy, in a process of its own.

    KERAS_BACKEND=tensorflow python tests/one_device_strategy.py

Prints `RESULT {...}` for `tests/distributed/fit_test.py`. In a pytest
process TensorFlow's distributed `evaluate` crashed with a segmentation
fault four times between 2026-11-26 and 2026-11-28 (in Keras's
`EpochIterator.reset`, after hundreds of other tests in that process;
never when the file ran alone), taking the worker and its tests with
it: a fresh process runs the scenario as a user's script would.
"""

import json

import keras
import numpy as np
import tensorflow as tf
from util import classification_data
from util import mlp

import kmp


def main():
    kmp.enable("mixed_float16")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = mlp()
        model.compile(
            optimizer=kmp.wrap("sgd"), loss="sparse_categorical_crossentropy"
        )
    returned = kmp.distribute(model) is model
    fit = model.fit
    idempotent = kmp.distribute(model).fit is fit
    x, y = classification_data()
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    predictions = model.predict(x, verbose=0)
    # evaluate's loss is the mean crossentropy of predict's outputs.
    expected = keras.losses.sparse_categorical_crossentropy(y, predictions)
    result = {
        "returned_the_model": returned,
        "idempotent": idempotent,
        "losses": [float(v) for v in history.history["loss"]],
        "predictions_shape": list(predictions.shape),
        "evaluated": float(model.evaluate(x, y, verbose=0)),
        "expected": float(np.mean(expected)),
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
