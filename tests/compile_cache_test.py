"""The persistent compilation cache (`kmp.compile_cache`): a second run
compiles nothing on JAX; bad directories; backends without a cache."""

import logging
import os

import pytest
from util import jax_only
from util import run_script

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


def test_backends_without_a_cache_say_so(tmp_path, caplog):
    if backend.name() == "jax":
        pytest.skip("JAX has a cache")
    with caplog.at_level(logging.WARNING, logger="kmp"):
        assert kmp.enable_compile_cache(tmp_path) is None
    assert "no compile cache" in caplog.text


@jax_only
def test_a_second_run_compiles_nothing(tmp_path):
    first = run_script("compiles.py", tmp_path, backend="jax")
    assert first["compiled"]["train_step"] >= 1 and not first["cache_hits"]
    assert os.listdir(tmp_path / "jax")
    second = run_script("compiles.py", tmp_path, backend="jax")
    assert second["compiled"] == {}
    assert second["cache_hits"] == first["compiled"]


@jax_only
def test_a_corrupted_entry_is_recompiled(tmp_path):
    run_script("compiles.py", tmp_path, backend="jax")
    for entry in os.listdir(tmp_path / "jax"):
        (tmp_path / "jax" / entry).write_bytes(b"not an executable")
    again = run_script("compiles.py", tmp_path, backend="jax")
    assert again["compiled"]["train_step"] >= 1  # no crash: compiled anew
