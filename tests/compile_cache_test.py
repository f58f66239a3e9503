"""The persistent compilation cache (`kmp.compile_cache`): a second run
compiles nothing on JAX; bad directories; backends without a cache."""

import logging
import os
import pathlib
import shutil

import pytest
from util import jax_only
from util import once_per_session
from util import run_script
from util import tf_only

import kmp
from kmp import backend


@pytest.mark.backend_independent
def test_a_file_is_not_a_cache_directory(tmp_path):
    path = tmp_path / "cache"
    path.write_text("")
    with pytest.raises(kmp.InputError, match="is a file"):
        kmp.enable_compile_cache(path)
    with pytest.raises(kmp.InputError, match="directory path"):
        kmp.enable_compile_cache(3)


@pytest.mark.backend_independent
def test_an_unwritable_directory_warns_and_training_goes_on(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="kmp"):
        assert kmp.enable_compile_cache(blocker / "below") is None
    assert "not writable" in caplog.text and "without it" in caplog.text


@pytest.mark.backend_independent
def test_default_directory_is_under_the_users_cache(monkeypatch):
    from kmp import compile_cache

    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert compile_cache.default_directory() == "/somewhere/kmp/xla"


def _start_tensorflow():
    import tensorflow as tf

    tf.constant(0.0)  # TensorFlow reads TF_XLA_FLAGS when it starts


def test_backends_without_a_cache_say_so(tmp_path, caplog):
    if backend.name() == "jax":
        pytest.skip("JAX has a cache")
    if backend.name() == "tensorflow":
        _start_tensorflow()  # a cache is then too late
    with caplog.at_level(logging.WARNING, logger="kmp"):
        assert kmp.enable_compile_cache(tmp_path) is None
    assert "no compile cache" in caplog.text


def _train(cache):
    """A small `kmp train imdb` (ragged train and test splits) with the
    cache in `cache`: its traces and compiles (tests/compiles.py)."""
    return run_script(
        "compiles.py",
        "imdb",
        "--data=synthetic",
        "--synthetic_size=300",
        "--d_model=16",
        "--heads=2",
        "--layers=1",
        "--sequence_length=16",
        "--vocabulary_size=64",
        "--batch_size=64",
        "--epochs=2",
        "--policy=mixed_float16",
        "--verbose=0",
        f"--output_dir={cache.parent / 'run'}",
        f"--compile_cache={cache}",
        backend="jax",
    )


@pytest.fixture(scope="session")
def first_run(tmp_path_factory):
    """The first run's cache and record, once for the pytest run (both
    pytest processes read them; the tests only read the cache)."""

    def train():
        cache = tmp_path_factory.mktemp("cache") / "xla"
        return str(cache), _train(cache)

    cache, first = once_per_session(tmp_path_factory, "compile_cache", train)
    return pathlib.Path(cache), first


@jax_only
@pytest.mark.slow
def test_a_run_compiles_each_step_once(first_run):
    _, first = first_run
    assert first["traces"] == {"train_step": 1, "test_step": 1}
    assert first["compiled"]["train_step"] == 1
    assert first["compiled"]["test_step"] == 1
    assert not first["cache_hits"]


@jax_only
@pytest.mark.slow
def test_a_second_run_compiles_nothing(first_run):
    cache, first = first_run
    assert os.listdir(cache / "jax")
    second = _train(cache)
    assert second["compiled"] == {}
    assert second["cache_hits"] == first["compiled"]


@jax_only
@pytest.mark.slow
def test_a_corrupted_entry_is_recompiled(first_run, tmp_path):
    cache, _ = first_run
    corrupted = tmp_path / "xla"
    shutil.copytree(cache, corrupted)
    for entry in os.listdir(corrupted / "jax"):
        (corrupted / "jax" / entry).write_bytes(b"not an executable")
    again = _train(corrupted)
    assert again["compiled"]["train_step"] == 1  # no crash: compiled anew


@tf_only
def test_the_same_directory_again_is_no_warning(tmp_path, monkeypatch, caplog):
    # TensorFlow has started in this process: only a change is refused.
    _start_tensorflow()
    folder = tmp_path / "tensorflow"
    monkeypatch.setenv(
        "TF_XLA_FLAGS", f"--tf_xla_persistent_cache_directory={folder}"
    )
    with caplog.at_level(logging.WARNING, logger="kmp"):
        assert kmp.enable_compile_cache(tmp_path) == str(folder)
        assert kmp.enable_compile_cache(tmp_path / "other") is None
    assert caplog.text.count("TensorFlow has started") == 1
