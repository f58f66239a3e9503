"""Which held model's outputs a trainer's crossentropies read
(`kmp.auditing.loss_flow`), read from keras-io's steps and from steps
written the ways a review found that a first reading got wrong."""

import importlib
import sys

import keras
import pytest
from audit_util import quiet_audit
from keras_io_models import compiled_gan
from keras_io_models import dcgan_discriminator
from keras_io_models import dcgan_generator
from keras_io_models import gan_class
from keras_io_models import keras3_gan_class
from keras_io_models import vae_class
from keras_io_models import vae_decoder
from keras_io_models import vae_encoder

import kmp
from kmp.auditing.loss_flow import trainer_losses

BCE = ["binary_crossentropy"]
ops = keras.ops


def _model(name, activation):
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(4, activation=activation)(inputs)
    return keras.Model(inputs, outputs, name=name)


class Trainer(keras.Model):
    """A GAN's two held models and a held loss; each test's subclass
    writes its own `train_step` (read, never run)."""

    def __init__(self, loss_fn=None):
        super().__init__()
        self.discriminator = _model("discriminator", "sigmoid")
        self.generator = _model("generator", "sigmoid")
        self.loss_fn = loss_fn or keras.losses.BinaryCrossentropy()


class DCGAN(Trainer):
    """keras-io's DCGAN's step, short: the generator's images joined
    with the real ones before the discriminator reads them."""

    def train_step(self, data):
        generated_images = self.generator(data)
        combined = ops.concatenate([generated_images, data], axis=0)
        predictions = self.discriminator(combined)
        d_loss = self.loss_fn(data, predictions)
        predictions = self.discriminator(self.generator(data))
        g_loss = self.loss_fn(data, predictions)
        return {"d_loss": d_loss, "g_loss": g_loss}


def test_a_held_loss_reads_the_discriminator_not_the_generator():
    # The generator's images reach the loss only through the
    # discriminator: its sigmoid is no crossentropy's.
    assert trainer_losses(DCGAN()) == {"discriminator": BCE}
    # The guide's GAN's reads logits.
    logits = keras.losses.BinaryCrossentropy(from_logits=True)
    assert trainer_losses(DCGAN(logits)) == {}


class Kept(Trainer):
    def train_step(self, data):
        generated_images = self.generator(data)
        self.last_generated = generated_images  # binds no name
        labels = ops.ones((4, 1)) * self.loss_fn.reduction_scale()
        return self.loss_fn(labels, self.discriminator(generated_images))


class Reused(Trainer):
    def train_step(self, data):
        out = self.generator(data)
        out = self.discriminator(out)  # replaces what `out` held
        return self.loss_fn(data, out)


class Paired(Trainer):
    def train_step(self, data):
        fake, scores = self.generator(data), self.discriminator(data)
        return self.loss_fn(fake, scores)


class Target(Trainer):
    def train_step(self, data):
        real = ops.stop_gradient(self.generator(data))
        return keras.losses.binary_crossentropy(real, self.discriminator(data))


class Aliases(Trainer):
    def train_step(self, data):
        loss_fn, disc = self.loss_fn, self.discriminator
        return loss_fn(data, disc(data))


class BuiltAtOnce(Trainer):
    def train_step(self, data):
        loss = keras.losses.BinaryCrossentropy()
        if (scores := self.discriminator(data)) is not None:
            loss = loss(data, scores)
        return loss + keras.losses.BinaryCrossentropy()(data, scores)


class Stateless(Trainer):
    def train_step(self, state, data):
        tv, ntv = state
        scores, ntv = self.discriminator.stateless_call(tv, ntv, data)
        return self.loss_fn(data, scores)


@pytest.mark.parametrize(
    "trainer", [Kept, Reused, Paired, Target, Aliases, BuiltAtOnce, Stateless]
)
def test_only_the_model_a_prediction_carries_is_read(trainer):
    # A review: `self.last = ...` bound `self` to the generator, a name
    # reused or a tuple held both models, a target counted as read.
    assert trainer_losses(trainer()) == {"discriminator": BCE}


def user_loss(real, fake):
    bce = keras.losses.BinaryCrossentropy()
    return bce(ops.ones_like(real), real) + bce(ops.zeros_like(fake), fake)


class Helper(Trainer):
    def train_step(self, data):
        return self.scores_loss(data, self.discriminator(data))

    def scores_loss(self, data, scores):
        return keras.losses.binary_crossentropy(data, scores)


class UserFunction(Trainer):
    def train_step(self, data):
        return user_loss(self.discriminator(data), self.generator(data))


@pytest.mark.parametrize("trainer", [Helper, UserFunction])
def test_a_crossentropy_whose_prediction_is_not_traced_counts_for_all(
    trainer,
):
    # A helper's parameter: which model it is, the step does not say.
    # Counted for every held model, as before the flow was read.
    assert trainer_losses(trainer()) == {
        "discriminator": BCE,
        "generator": BCE,
    }


class Discriminate(Trainer):
    def discriminate(self, x):
        return self.discriminator(x)

    def train_step(self, data):
        fake = self.generator(data)
        return self.loss_fn(data, self.discriminate(fake))


class Looked(Trainer):
    def train_step(self, data):
        nets = {"d": self.discriminator}
        return self.loss_fn(data, nets["d"](self.generator(data)))


class Looped(Trainer):
    def train_step(self, data):
        fake = self.generator(data)
        for net in (self.discriminator,):
            scores = net(fake)
        return self.loss_fn(data, scores)


@pytest.mark.parametrize("trainer", [Discriminate, Looked, Looped])
def test_a_call_of_the_user_s_own_may_return_any_model_s_output(trainer):
    # A second review: a helper method, a dict or a loop variable passed
    # on its argument's model, so the generator got the crossentropy's
    # error and the discriminator a warning.
    assert trainer_losses(trainer()) == {
        "discriminator": BCE,
        "generator": BCE,
    }


class Branches(Trainer):
    def train_step(self, data):
        if data is None:
            scores = self.discriminator(data)
        else:
            scores = self.generator(data)
        return self.loss_fn(data, scores)


def test_a_name_bound_in_a_branch_keeps_what_it_held():
    assert trainer_losses(Branches()) == {
        "discriminator": BCE,
        "generator": BCE,
    }


class Registry:
    """A user's object whose `__getattr__` raises KeyError."""

    def __init__(self):
        self.__dict__["table"] = {}

    def __getattr__(self, key):
        return self.table[key]

    def __call__(self, y, p):
        return ops.mean((y - p) ** 2)


class Registered(Trainer):
    def __init__(self):
        super().__init__()
        self.reg = Registry()

    def train_step(self, data):
        return self.reg(data, self.discriminator(data))


class Raises(Trainer):
    @property
    def boom(self):
        raise RuntimeError("not to be read")

    def train_step(self, data):
        scores = self.discriminator(data)
        self.boom(scores)
        return self.compute_loss(x=data, y=data, y_pred=scores)


def test_what_cannot_be_read_is_no_loss_and_no_crash():
    # Keras's `compute_loss` holds a `CompileLoss`, whose `get_config`
    # raises, a property of the user's may raise, and so may an
    # object's `__getattr__` with a KeyError: the audit crashed.
    trainer = Raises()
    trainer.compile(loss="binary_crossentropy")
    assert trainer_losses(trainer) == {}
    kmp.audit(trainer, verbose=False)
    assert trainer_losses(Registered()) == {}
    kmp.audit(Registered(), verbose=False)


@pytest.fixture
def default_recursion_limit():
    """Python's default recursion limit, 1000, for the test: torch's
    inductor raises it to 2000 for good in a process that compiled, and
    a CI run whose worker had compiled before walked a deep step whole."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    yield
    sys.setrecursionlimit(limit)


def test_a_step_too_deep_to_walk_is_left_unread(
    tmp_path, monkeypatch, default_recursion_limit
):
    # One expression of 600 terms: past Python's default recursion limit.
    terms = " + ".join(["scores"] * 600)
    (tmp_path / "deep_step.py").write_text(
        "def train_step(self, data):\n"
        "    scores = self.discriminator(data)\n"
        f"    return self.loss_fn(data, {terms})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    deep_step = importlib.import_module("deep_step")
    deep = type("Deep", (Trainer,), {"train_step": deep_step.train_step})
    assert trainer_losses(deep()) == {}
    # The audit's other reading of the step (`ast.unparse`) crashed.
    kmp.audit(deep(), optimizer=kmp.wrap("adam"), verbose=False)


class Torch(Trainer):
    def train_step(self, data):
        import torch.nn.functional as F

        scores = self.discriminator(data)
        logits = self.generator(data)
        return F.binary_cross_entropy(scores, data) + F.cross_entropy(
            logits, data
        )


def test_torch_s_probability_crossentropies():
    # `F.cross_entropy` takes logits; `binary_cross_entropy` takes
    # probabilities (its `input`, first).
    pytest.importorskip("torch")  # the step's import, found imported
    assert trainer_losses(Torch()) == {
        "discriminator": ["binary_cross_entropy"]
    }


@pytest.mark.backend_independent
def test_keras_io_s_dcgan_and_vae_as_written():
    # The steps are TensorFlow's. The audit counted only crossentropies
    # the step called by name, so the DCGAN discriminator's float16
    # sigmoid under its held `BinaryCrossentropy()` was a warning. The
    # VAE's `Sampling` draws float32: built before the policy.
    vae = vae_class()(vae_encoder(), vae_decoder())
    assert trainer_losses(vae) == {"decoder": BCE}
    kmp.enable("mixed_float16")
    for cls in (gan_class, keras3_gan_class):
        gan = compiled_gan(
            cls(), dcgan_discriminator(), dcgan_generator(), kmp.wrap
        )
        assert trainer_losses(gan) == {"discriminator": BCE}
    found = {
        f.where.split("/")[0]: f
        for f in quiet_audit(gan)
        if "float16 sigmoid" in f.problem
    }
    assert found["discriminator"].severity == "error"
    assert "past float16's 65504" in found["discriminator"].problem
    assert found["generator"].severity == "warning"


def _combined(as_dict=False):
    """A GAN's combined model of two outputs: the discriminator's
    sigmoid score of the generator's sigmoid images, and the images."""
    z = keras.Input((4,))
    images = keras.layers.Dense(4, activation="sigmoid", name="images")(z)
    dense = keras.layers.Dense(1, activation="sigmoid", name="validity")
    validity = dense(images)
    if as_dict:
        outputs = {"validity": validity, "images": images}
    else:
        outputs = [validity, images]
    return keras.Model(z, outputs, name="combined")


class Combined(keras.Model):
    """A trainer of a two-output model whose crossentropy reads one."""

    def __init__(self, as_dict=False):
        super().__init__()
        self.combined = _combined(as_dict)
        self.loss_fn = keras.losses.BinaryCrossentropy()


class Unpacked(Combined):
    def train_step(self, data):
        validity, images = self.combined(data)
        return self.loss_fn(data, validity) + ops.mean(images)


class Subscripted(Combined):
    def train_step(self, data):
        out = self.combined(data)
        return self.loss_fn(data, out[0]) + ops.mean(out[1])


class FromTheEnd(Combined):
    def train_step(self, data):
        scores = self.combined(data)[-2]  # the call's result, at once
        return self.loss_fn(data, ops.concatenate([scores, scores]))


@pytest.mark.parametrize("trainer", [Unpacked, Subscripted, FromTheEnd])
def test_one_output_of_a_held_model_is_told_apart(trainer):
    # The crossentropy reads the score; the images reach it through the
    # discriminator's layer alone. Counted for the whole model, both
    # sigmoids were a crossentropy's.
    assert trainer_losses(trainer()) == {"combined/validity": BCE}


class Images(Combined):
    def train_step(self, data):
        out = self.combined(data)
        return self.loss_fn(data, out[-1])


class Named(Combined):
    def __init__(self):
        super().__init__(as_dict=True)

    def train_step(self, data):
        out = self.combined(data)
        return self.loss_fn(data, out["validity"])


def test_a_negative_index_and_a_dict_s_key():
    assert trainer_losses(Images()) == {"combined/images": BCE}
    assert trainer_losses(Named()) == {"combined/validity": BCE}


class Indexed(Combined):
    def train_step(self, data):
        i = 0
        out = self.combined(data)
        return self.loss_fn(data, out[i])


class Starred(Combined):
    def train_step(self, data):
        validity, *rest = self.combined(data)
        return self.loss_fn(data, validity)


class Stacked(Combined):
    def train_step(self, data):
        out = ops.stack(self.combined(data))
        return self.loss_fn(data, out[0])


class StatelessPair(Combined):
    def train_step(self, state, data):
        tv, ntv = state
        (validity, images), ntv = self.combined.stateless_call(tv, ntv, data)
        return self.loss_fn(data, validity)


class DictIndexed(Combined):
    def __init__(self):
        super().__init__(as_dict=True)

    def train_step(self, data):
        validity, images = self.combined(data)  # a dict's keys
        out = self.combined(data)
        return self.loss_fn(data, validity) + self.loss_fn(data, out[0])


@pytest.mark.parametrize(
    "trainer", [Indexed, Starred, Stacked, StatelessPair, DictIndexed]
)
def test_an_output_not_told_apart_counts_for_every_output(trainer):
    # An index that is no constant, a starred name, a function's result,
    # a `stateless_call`'s `(outputs, variables)`, a dict unpacked or
    # indexed by number: the whole model, as before outputs were told
    # apart.
    assert trainer_losses(trainer()) == {"combined": BCE}


def test_the_audit_errs_on_the_output_the_crossentropy_reads():
    # Both sigmoids float16: the score under the crossentropy is an
    # error; the images, which no crossentropy reads, are a warning.
    keras.config.set_dtype_policy("mixed_float16")
    for trainer in (Unpacked(), Subscripted()):
        found = {
            f.where: f.severity
            for f in quiet_audit(trainer)
            if "float16 sigmoid" in f.problem
        }
        assert found == {
            "combined/validity": "error",
            "combined/images": "warning",
        }
    # An index not told apart: both, as before.
    found = {
        f.where: f.severity
        for f in quiet_audit(Indexed())
        if "float16 sigmoid" in f.problem
    }
    assert found == {"combined/validity": "error", "combined/images": "error"}
