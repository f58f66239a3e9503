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
        lm, _tiny_lm(tmp_path), show=lines.append
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
                lm, _tiny_lm(tmp_path, distribution="data")
            )
        return
    with pytest.raises(kmp.InputError, match="only the JAX backend"):
        batch_search.largest_batch(lm, _tiny_lm(tmp_path))


def test_a_cpu_s_limit_is_bounded_and_said(tmp_path, monkeypatch):
    from kmp import backend

    config = _tiny_lm(tmp_path, memory_limit=0)
    monkeypatch.setattr(
        backend, "device_memory_limit", lambda: (64 * 2**30, "host memory")
    )
    # Half of what is available, when that is under CPU_LIMIT...
    limit, source = batch_search.memory_limit(config, lambda: 3 * 2**30)
    assert limit == 3 * 2**29
    assert "half the 3.0 GiB available" in source
    assert "--memory_limit sets it" in source
    # ... else CPU_LIMIT, whatever the host holds.
    limit, _ = batch_search.memory_limit(config, lambda: 60 * 2**30)
    assert limit == batch_search.CPU_LIMIT == 4 * 2**30
    # An accelerator's own limit, and --memory_limit, are kept as given.
    monkeypatch.setattr(
        backend, "device_memory_limit", lambda: (80 * 2**30, "H100 limit")
    )
    assert batch_search.memory_limit(config, lambda: 1) == (
        80 * 2**30,
        "H100 limit",
    )
    given = _tiny_lm(tmp_path, memory_limit=2**30)
    assert batch_search.memory_limit(given) == (2**30, "--memory_limit")


def test_the_batch_is_bounded_by_the_data(tmp_path):
    # The language model's data: 8192 bytes cut into 63 windows of 128.
    config = _tiny_lm(tmp_path, data="synthetic", text_bytes=8192)
    config.sequence_length = 128
    assert batch_search.data_bound(lm, config) == (63, "the 63 training rows")
    # Five steps an epoch take five batches of the split.
    config.steps = 5
    rows, what = batch_search.data_bound(lm, config)
    assert (rows, what) == (12, "the 63 training rows over --steps=5")


def test_the_data_s_bound_is_probed_first():
    # It fits: one compile. It does not: the search below it.
    tried = []

    def probe(batch):
        tried.append(batch)
        return batch

    assert batch_search._bounded_search(probe, 100, most=60) == 60
    assert tried == [60]
    tried.clear()
    assert batch_search._bounded_search(probe, 100, most=500) == 96
    assert tried == [500, 8, 16, 96, 104]


def test_run_config_gives_at_most_what_the_data_feeds(tmp_path, monkeypatch):
    # The run: a CPU's search found 4664, the data held one such
    # batch, and --steps=5 ran out of data after the first step.
    def largest(example, config, show, most=None):
        record = {"train_step": {"footprint": 2**30}, "limit_bytes": 2**31}
        record["limit_source"] = "--memory_limit"
        return min(4664, most or 4664), record

    monkeypatch.setattr(batch_search, "largest_batch", largest)
    config = _tiny_lm(tmp_path, data="synthetic", text_bytes=8192, steps=5)
    config.sequence_length = 128
    lines = []
    sized, record = batch_search.run_config(lm, config, lines.append)
    assert sized.batch_size == record["data_bound"] == 12
    assert lines == [
        "kmp: --batch_size=max -> 12: the 63 training rows over --steps=5, "
        "the most the data feeds without repeating rows (train step "
        "1,024.0 MiB of 2,048 MiB, --memory_limit)"
    ]
    # Not one row a step: refused before anything compiles.
    config.steps = 64
    with pytest.raises(kmp.InputError, match="leave not one row per step"):
        batch_search.run_config(lm, config)
    # A given batch is left alone, with no search.
    given = _tiny_lm(tmp_path, batch_size=4664)
    assert batch_search.run_config(lm, given) == (given, None)
