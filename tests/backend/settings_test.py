"""Process-wide settings (`kmp.backend.settings`): TF32 and the
persistent compile cache's switch (`kmp.enable_compile_cache`, its user,
is tested in compile_cache_test.py)."""

import os

from kmp import backend


def test_tf32_is_off_in_tests():
    assert backend.tf32_enabled() is False


def test_tf32_can_be_turned_off_again():
    backend.disable_tf32()
    assert backend.tf32_enabled() is False


def test_the_compile_cache_switch_says_why_a_backend_has_none(tmp_path):
    why_not = backend.use_compile_cache(str(tmp_path))
    if backend.name() == "torch":
        assert "torch.compile keeps its own cache" in why_not
    elif backend.name() == "jax":
        import jax

        assert why_not is None
        assert jax.config.jax_compilation_cache_dir == str(tmp_path)
    else:
        # TensorFlow reads TF_XLA_FLAGS once; in the suite it has started.
        assert why_not is None or "TensorFlow has started" in why_not
        if why_not is None:
            assert str(tmp_path) in os.environ["TF_XLA_FLAGS"]
    backend.use_compile_cache(None)
