"""`kmp.pin_float32`'s mark in a `.keras` file: the saved model was pinned.

`kmp.load_model` pins a loaded model again where its file shows that the
saved model was pinned (`kmp.saving`), for what no file keeps: the
islands inside layers that other layers make in code, and the outputs
`float32_outputs` casts. A config shows most pinned models by their
float32 outputs or kmp's island classes; a model whose every output is
cast, and that holds no island class (a feature extractor), showed
nothing, and came back returning float16.

So `mark_pinned` gives the pinned model, and each model it holds (which
pinning pinned too, and which may be saved on its own: keras-io's
pretraining guide saves its encoder), an instance-level `save_assets`,
Keras's hook for a saveable's own files, which writes `MARK` into the
archive's `assets/` folder at the saved model's own path, its root:
`assets/kmp_pinned.json`. `pinned_in` reads only that one. A pinned
model held inside another (a pinned backbone under a head, the whole
saved unpinned) writes its mark under its own path, so it does not
make the model that holds it pinned, and `kmp.load_model` gives that
model back as saved.

Like the cast, the mark is the instance's: a copy, `clone_model`, a
pickle or a load by Keras alone has none until `kmp.pin_float32` runs on
it (`kmp.load_model` pins, and so marks, what it loads pinned). Deleting
the instance's `save_assets` (`del model.save_assets`) removes it. A
class's own `save_assets` runs first.
"""

import json
import os

# Written at the root of the archive's `assets/` folder.
MARK = "kmp_pinned.json"
_NOTE = (
    "kmp.pin_float32 pinned this model; kmp.load_model pins it again on "
    "load, for the float32 islands and output casts no config keeps."
)


def mark_pinned(model) -> None:
    """Makes a `.keras` file of `model` record that it was pinned."""
    if getattr(vars(model).get("save_assets"), "_kmp_pinned", False):
        return
    own = getattr(model, "save_assets", None)

    def save_assets(dir_path):
        if own is not None:
            own(dir_path)
        with open(os.path.join(dir_path, MARK), "w") as f:
            json.dump({"note": _NOTE}, f)

    save_assets._kmp_pinned = True
    model.save_assets = save_assets


def pinned_in(archive) -> bool:
    """Whether a `.keras` archive (an open `zipfile.ZipFile`) holds a
    model `kmp.pin_float32` pinned: its mark at the root of `assets/`."""
    return f"assets/{MARK}" in archive.namelist()
