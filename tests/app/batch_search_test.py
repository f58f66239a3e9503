"""`--batch_size=max` (`kmp.app.batch_search`): the search finds the
largest batch that fits, in multiples of 8, in 2 log2(batch / 8) + 3
compiles at most; on JAX from the compiled step of a real example, and
on the other backends one clear error."""

import math

import hypothesis
import pytest
from hypothesis import strategies as st
from util import jax_only

import kmp
from kmp.app import batch_search
from kmp.examples import lm


def _searched(threshold):
    tried = []

    def fits(batch):
        tried.append(batch)
        return batch <= threshold

    return batch_search._search(fits), tried


def test_exact_answers_and_probes():
    assert _searched(100) == (96, [8, 16, 32, 64, 128, 96, 112, 104])
    assert _searched(5) == (5, [8, 4, 6, 5])
    assert _searched(0) == (0, [8, 4, 2, 1])
    assert _searched(8)[0] == 8
    assert _searched(10**9)[0] == batch_search.CAP


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.integers(0, 200_000))
def test_the_largest_that_fits_to_a_multiple_of_eight(threshold):
    found, tried = _searched(threshold)
    expected = threshold if threshold < 8 else threshold // 8 * 8
    assert found == expected
    # Doubling from 8 to the first miss, then bisecting back to a step
    # of 8: 2 log2(batch / 8) + 3 compiles at most (under 8: 8, 4, 2, 1).
    assert len(tried) <= max(2 * math.log2(max(threshold, 8) / 8) + 3, 4)


def _tiny_lm(tmp_path, **overrides):
    settings = dict(
        batch_size=0,  # --batch_size=max
        hidden_dim=32,
        heads=2,
        layers=1,
        sequence_length=32,
        output_dir=str(tmp_path),
        memory_limit=20 * 2**20,
    )
    settings.update(overrides)
    return lm.Config(**settings)


@pytest.mark.slow
@jax_only
def test_the_lm_s_largest_batch_fits_and_the_next_does_not(tmp_path):
    lines = []
    batch, record = batch_search.largest_batch(
        "lm", _tiny_lm(tmp_path), show=lines.append
    )
    limit = record["limit_bytes"]
    assert (limit, record["limit_source"]) == (20 * 2**20, "--memory_limit")
    assert batch >= 8 and batch % 8 == 0
    probes = {p["batch_size"]: p for p in record["probes"]}
    assert probes[batch]["footprint"] <= limit
    assert probes[batch + 8]["footprint"] > limit  # bisected to a step of 8
    assert record["train_step"]["footprint"] == probes[batch]["footprint"]
    assert len(lines) == len(probes) and "fits in 20 MiB" in lines[0]


def test_other_backends_and_distributions_are_one_clear_error(tmp_path):
    from kmp import backend

    if backend.name() == "jax":
        with pytest.raises(kmp.InputError, match="per-device search"):
            batch_search.largest_batch(
                "lm", _tiny_lm(tmp_path, distribution="data")
            )
        return
    with pytest.raises(kmp.InputError, match="only the JAX backend"):
        batch_search.largest_batch("lm", _tiny_lm(tmp_path))
