"""Keras 3 on the torch backend, in the shape of keras.io's "Simple MNIST convnet": a
``Sequential`` convnet compiled with ``optimizer="adam"`` and trained by ``fit()`` with a
validation split, then evaluated, saved as ``.keras`` and loaded back. Keras keeps every
variable in one ``ParameterDict`` keyed by its path (``sequential/conv2d/kernel``) and steps
them with its own optimizer, no ``torch.optim.Optimizer``.

Prints, per batch, the batch's loss (from the running mean Keras logs) and the norm of the
gradients its ``backward()`` left (Keras sets them to None before the next batch), then
the evaluation and whether the loaded model predicts as the trained one.

argv: OUT_DIR. ``KERAS_WATCH=1``: the script calls ``sentinel.watch(model)``.
"""

import os
import sys

os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from keras import layers  # noqa: E402

out_dir = sys.argv[1]
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(1024, 12, 12, 1)).astype("float32")
y = keras.utils.to_categorical((x.reshape(1024, -1) @ rng.normal(size=(144, 10))).argmax(1), 10)
model = keras.Sequential([
    keras.Input(shape=(12, 12, 1)),
    layers.Conv2D(8, 3, activation="relu"),
    layers.MaxPooling2D(2),
    layers.Flatten(),
    layers.Dropout(0.5),
    layers.Dense(10, activation="softmax"),
])
if os.environ.get("KERAS_WATCH") == "1":
    import sentinel

    sentinel.watch(model)
model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])


class Batches(keras.callbacks.Callback):
    """Each batch's own loss, undone from the epoch's running mean Keras logs."""

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.mean = 0.0

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        mean = float(logs["loss"])
        loss = (batch + 1) * mean - batch * self.mean
        self.mean = mean
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        print(f"batch {loss:.6f} {norm:.6f}")


model.fit(x, y, batch_size=128, epochs=3, validation_split=0.125, verbose=0, callbacks=[Batches()])
loss, acc = model.evaluate(x[:256], y[:256], verbose=0)
print(f"evaluate {loss:.5f} {acc:.5f}")
path = os.path.join(out_dir, "model.keras")
model.save(path)
again = keras.saving.load_model(path)
print("loaded", np.allclose(again.predict(x[:8], verbose=0), model.predict(x[:8], verbose=0)))
