"""What a run does before its example's `train` (`kmp.app.startup`):
start-up once, CPU sizes, `kmp train`'s order."""

import pytest

import kmp_cli
from kmp.app import startup
from kmp_config import configs


class Seen(Exception):
    """Carries the config a stand-in `train` was called with."""


def _seen_train(config):
    raise Seen(config)


@pytest.mark.backend_independent
@pytest.mark.parametrize("gpu", [False, True])
def test_without_a_gpu_the_sizes_not_given_are_cpu_sizes(gpu, monkeypatch):
    monkeypatch.setattr(startup, "has_accelerator", lambda: gpu)
    config = configs.Cifar10Config(batch_size=64, compile_cache="off")
    shown = []
    trained, search = startup.prepare(
        None, config, {"batch_size"}, shown.append
    )
    assert search is None  # a given batch: nothing searched
    assert trained.batch_size == 64  # given: it wins
    if gpu:
        assert trained == config and shown == []
    else:
        assert trained.width == 16
        assert shown == [
            "kmp: no GPU found: width=16 (CPU sizes); pass them to override."
        ]


@pytest.mark.backend_independent
def test_devices_are_not_asked_when_every_size_is_given_or_multiworker(
    monkeypatch,
):
    def asked():
        raise AssertionError("listed the devices")

    monkeypatch.setattr(startup, "has_accelerator", asked)
    config = configs.Cifar10Config(batch_size=64, width=8)
    assert startup.device_sized(config, {"batch_size", "width"}) == (
        config,
        None,
    )
    # Listing devices would start TensorFlow before the cluster's
    # collective ops are configured.
    multiworker = configs.Cifar10Config(strategy="multiworker")
    assert startup.device_sized(multiworker) == (multiworker, None)


@pytest.mark.backend_independent
def test_start_up_runs_once_for_the_same_settings(monkeypatch):
    calls = []
    monkeypatch.setattr(startup, "_started", set())
    monkeypatch.setattr(
        startup.scale_out, "start_processes", lambda c: calls.append("join")
    )
    monkeypatch.setattr(
        startup, "use_compile_cache", lambda c: calls.append("cache")
    )
    config = configs.ImdbConfig(compile_cache="off")
    startup.start(config)
    startup.start(config)  # the example's Run, after `kmp train`'s
    assert calls == ["join", "cache"]
    startup.start(configs.ImdbConfig(compile_cache="/tmp/elsewhere"))
    assert calls == ["join", "cache", "join", "cache"]


@pytest.mark.backend_independent
def test_kmp_train_runs_the_example_on_its_cpu_sized_config(
    monkeypatch, capsys
):
    from kmp.examples import imdb

    monkeypatch.setattr(startup, "has_accelerator", lambda: False)
    monkeypatch.setattr(imdb, "train", _seen_train)
    with pytest.raises(Seen) as seen:
        kmp_cli.main(
            [
                "train",
                "imdb",
                "--d_model=32",
                "--steps=1",
                "--compile_cache=off",
            ]
        )
    trained = seen.value.args[0]
    assert (trained.d_model, trained.steps) == (32, 1)
    assert (trained.batch_size, trained.sequence_length) == (32, 128)
    assert "no GPU found: batch_size=32, sequence_length=128" in (
        capsys.readouterr().out
    )


@pytest.mark.backend_independent
def test_has_accelerator_is_the_backend_s_first_device():
    from kmp import backend

    expected = backend.list_devices()[0].platform in ("gpu", "tpu")
    assert startup.has_accelerator() == expected
