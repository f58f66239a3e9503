"""`--batch_size=max` (`kmp.app.batch_search`): the search finds the
largest batch that fits, in multiples of 8, in at most 6 compiles where
the bytes grow linearly with the batch and a bounded number where they
grow any other way; on JAX from the compiled step of a real example,
and on the other backends one clear error."""

import math
import pathlib

import hypothesis
import pytest
from hypothesis import strategies as st
from util import jax_only

import kmp
from kmp.app import batch_search
from kmp.examples import lm


def _searched(footprint, limit):
    tried = []

    def probe(batch):
        tried.append(batch)
        return footprint(batch)

    return batch_search._search(probe, limit), tried


def _expected(footprint, limit):
    """The answer by brute force: the largest multiple of 8 that fits,
    or below 8 the largest batch that does (0: none)."""
    if footprint(8) > limit:
        return max([0] + [b for b in range(1, 8) if footprint(b) <= limit])
    batch = 8
    while batch < batch_search.CAP and footprint(batch + 8) <= limit:
        batch += 8
    return batch


def test_exact_answers_and_probes():
    # Bytes linear in the batch: 8 and 16, the line's answer, its check.
    assert _searched(lambda b: b, 100) == (96, [8, 16, 96, 104])
    linear = lambda b: 1000 + 37 * b  # noqa: E731
    assert _searched(linear, linear(293)) == (288, [8, 16, 288, 296])
    assert _searched(lambda b: b, 5) == (5, [8, 4, 5, 6])
    assert _searched(lambda b: b, 0) == (0, [8, 4, 2, 1])
    assert _searched(lambda b: b, 8) == (8, [8, 16])
    assert _searched(lambda b: b, 10**9)[0] == batch_search.CAP


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(
    st.integers(0, 10**9),
    st.integers(1, 10**6),
    st.integers(0, 10**11),
)
def test_linear_bytes_take_at_most_six_compiles(fixed, per_row, limit):
    footprint = lambda b: fixed + per_row * b  # noqa: E731
    found, tried = _searched(footprint, limit)
    if found < batch_search.CAP:
        assert found == _expected(footprint, limit)
    assert len(tried) <= 6


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(
    st.lists(st.integers(0, 1000), min_size=1, max_size=40),
    st.integers(0, 2000),
)
def test_any_growing_bytes_give_the_largest_that_fits(steps, limit):
    # Bytes that grow by any steps, at any batches: still the answer,
    # and at most twice the bisection's compiles (the bracket halves at
    # least every second probe) plus the growth phase.
    edges = sorted(steps)

    def footprint(batch):
        return sum(1 for edge in edges if edge * 8 < batch) * 50 + batch // 64

    found, tried = _searched(footprint, limit)
    if found < batch_search.CAP:
        assert found == _expected(footprint, limit)
    assert len(tried) <= 2 * math.log2(batch_search.CAP / 8) + 8


def test_the_h200_s_probes_replayed_take_four_compiles():
    # The footprints the H200 measured for the float32 language model
    # (BENCHMARKS.md, "Memory modes on an H200"): the search that ran
    # there doubled and bisected, 8 16 32 64 48 40; this one goes from
    # the line through 8 and 16 to 40, and checks 48.
    import json
    import re

    results = pathlib.Path(__file__).parents[2] / "benchmarks" / "results"
    h200 = results / "h200_2026-11-26"
    printed = (h200 / "max_batch_float32.txt").read_text()
    mib = {
        int(b): float(m.replace(",", ""))
        for b, m in re.findall(
            r"kmp: batch +(\d+): train step ([\d,.]+)", printed
        )
    }
    for batch in (40, 48):
        data = json.loads(
            (h200 / f"footprint_float32_{batch}.json").read_text()
        )
        mib[batch] = data["modes"]["float32"]["train_step"]["footprint"] / 2**20
    found, tried = _searched(mib.__getitem__, 16384)
    assert (found, tried) == (40, [8, 16, 40, 48])


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
