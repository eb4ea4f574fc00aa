"""pace.cost: ring formula by hand, fitting recovers known models, what-if rescaling."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pace.cost
import pace.verify
from pace.cost import (
    FitQuality,
    WhatIf,
    fit_linear,
    ring_allreduce_us,
    ring_beta_us_per_byte,
    ring_comm_model,
    what_if,
)
from pace.errors import InputError
from pace.ir import CommModel


@pytest.mark.parametrize("module", [pace.cost, pace.verify])
def test_docstring_examples(module: object) -> None:
    result = doctest.testmod(module)  # type: ignore[arg-type]
    assert result.failed == 0
    assert result.attempted > 0


def test_ring_formula_by_hand() -> None:
    # W=4, B=10 Gbit/s = 1250 B/us, G=2 GB/s = 2000 B/us, S=4 MB.
    s = 4_000_000
    chunk = s / 4
    expected = chunk * 2 * 3 / 1250 + chunk * 3 / 2000  # 4800 + 1500
    assert expected == 6300.0
    got = ring_allreduce_us(s, workers=4, bandwidth_gbps=10, reduce_gbytes_per_s=2)
    assert got == pytest.approx(6300.0, rel=1e-12)
    assert ring_allreduce_us(
        s, workers=4, bandwidth_gbps=10, reduce_gbytes_per_s=2, latency_us=35
    ) == pytest.approx(6335.0, rel=1e-12)
    # Without the reduction term: transmission only.
    assert ring_allreduce_us(s, workers=4, bandwidth_gbps=10) == pytest.approx(4800.0)
    # One worker: nothing to send.
    assert ring_allreduce_us(s, workers=1, bandwidth_gbps=10, latency_us=7) == 7.0


def test_ring_comm_model_matches_formula_and_synth_default() -> None:
    m = ring_comm_model(workers=8, bandwidth_gbps=10, reduce_gbytes_per_s=5, latency_us=12)
    for s in (0, 1, 1000, 10**8):
        assert m.cost_us(s) == pytest.approx(
            ring_allreduce_us(s, workers=8, bandwidth_gbps=10, reduce_gbytes_per_s=5, latency_us=12)
        )
    # pace.synth's default beta is the transmission term at 10 Gbit/s.
    assert ring_beta_us_per_byte(workers=8, bandwidth_gbps=10) == pytest.approx(
        2 * 7 / 8 * 8 / 10e3
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bandwidth_gbps": -1}, "--bandwidth-gbps: must be > 0, got -1"),
        ({"bandwidth_gbps": 0}, "--bandwidth-gbps: must be > 0, got 0"),
        (
            {"bandwidth_gbps": float("nan")},
            "--bandwidth-gbps: must be a finite number > 0, got nan",
        ),
        ({"workers": 0}, "--workers: must be an integer >= 1, got 0"),
        ({"workers": 2.5}, "--workers: must be an integer >= 1, got 2.5"),
        ({"workers": True}, "--workers: must be an integer >= 1, got True"),
        (
            {"reduce_gbytes_per_s": 3},
            "--reduce-gbytes-per-s: only applies together with --bandwidth-gbps",
        ),
        (
            {"bandwidth_gbps": 10, "reduce_gbytes_per_s": -3},
            "--reduce-gbytes-per-s: must be > 0, got -3",
        ),
    ],
)
def test_what_if_options_name_the_option(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(InputError) as info:
        WhatIf(**kwargs)  # type: ignore[arg-type]
    assert str(info.value).startswith(message)
    comm = CommModel(workers=4, alpha_us=1.0, beta_us_per_byte=1e-3)
    with pytest.raises(InputError):
        what_if(comm, **kwargs)  # type: ignore[arg-type]


def test_what_if_workers_scales_both_terms_exactly() -> None:
    # A measured model that is Eqn. 1 at W=4 (with reduction) must become Eqn. 1 at W=16.
    measured = ring_comm_model(workers=4, bandwidth_gbps=25, reduce_gbytes_per_s=3, latency_us=40)
    scaled = what_if(measured, workers=16)
    truth = ring_comm_model(workers=16, bandwidth_gbps=25, reduce_gbytes_per_s=3, latency_us=40)
    assert scaled.workers == 16
    assert scaled.alpha_us == 40.0  # alpha kept (documented choice)
    assert scaled.beta_us_per_byte == pytest.approx(truth.beta_us_per_byte, rel=1e-12)


def test_what_if_bandwidth_replaces_beta() -> None:
    comm = CommModel(workers=4, alpha_us=25.0, beta_us_per_byte=0.123, samples=((1, 1.0), (2, 2.0)))
    out = what_if(comm, bandwidth_gbps=100)
    assert out.beta_us_per_byte == pytest.approx(0.75 * 2 / 12500)
    assert out.alpha_us == 25.0
    assert out.workers == 4
    assert out.samples == ()
    both = what_if(comm, bandwidth_gbps=100, workers=2, reduce_gbytes_per_s=10)
    assert both.beta_us_per_byte == pytest.approx(0.5 * (2 / 12500 + 1 / 10000))
    # More bandwidth is never slower.
    assert what_if(comm, bandwidth_gbps=200).beta_us_per_byte < out.beta_us_per_byte


def test_what_if_identity_and_single_worker() -> None:
    comm = CommModel(workers=1, alpha_us=3.0, beta_us_per_byte=0.0)
    assert what_if(comm) is comm
    assert what_if(comm, workers=1) == comm
    with pytest.raises(InputError, match="--workers: cannot rescale"):
        what_if(comm, workers=4)
    assert what_if(comm, workers=4, bandwidth_gbps=10).beta_us_per_byte > 0


@settings(max_examples=50)
@given(
    alpha=st.floats(0.0, 500.0),
    beta=st.floats(1e-6, 1e-2),
    seed=st.integers(0, 2**31 - 1),
)
# The bytes term only 57% of the largest messages' cost: 1% noise moved the slope by 2.0%.
@example(alpha=482.0, beta=1e-5, seed=247692793)
def test_fit_recovers_known_model_from_noisy_samples(alpha: float, beta: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in np.geomspace(4, 64e6, 24)] * 3
    # 1% multiplicative timing noise, as in a benchmark's repeated runs.
    samples = [(s, (alpha + beta * s) * float(rng.normal(1.0, 0.01))) for s in sizes]
    model, quality = fit_linear(samples, workers=4)
    assert model.workers == 4
    assert model.samples == tuple((b, us) for b, us in samples)
    # The fitted model predicts the noise-free cost at every size to well within the noise.
    for size in sizes[:24]:
        true_us = alpha + beta * size
        assert model.cost_us(size) == pytest.approx(true_us, rel=0.03, abs=1e-9)
    # Each coefficient is recovered where it is identifiable: beta to 2% when the bytes term
    # is most (4/5) of the largest messages' cost (where it is barely half, 1% noise on the
    # samples moves the slope by 2%), alpha to the noise level of the smallest ones.
    if beta * sizes[23] >= 4 * alpha:
        assert model.beta_us_per_byte == pytest.approx(beta, rel=0.02)
    assert abs(model.alpha_us - alpha) <= 0.03 * (alpha + beta * 4) + 1e-9
    assert quality.n_samples == len(samples)
    assert quality.median_rel_error < 0.02
    assert quality.max_rel_error < 0.1


def test_fit_quality_r2_on_a_clearly_linear_benchmark() -> None:
    rng = np.random.default_rng(7)
    sizes = [int(s) for s in np.geomspace(1e3, 1e8, 30)]
    samples = [(s, (30.0 + 8e-4 * s) * float(rng.normal(1.0, 0.02))) for s in sizes]
    model, quality = fit_linear(samples, workers=8)
    assert quality.r2 > 0.99
    assert model.beta_us_per_byte == pytest.approx(8e-4, rel=0.02)
    # Pure noise around a constant: a line explains little of it.
    flat = [(s, 50.0 * float(rng.normal(1.0, 0.05))) for s in sizes]
    _, flat_quality = fit_linear(flat, workers=8)
    assert flat_quality.r2 < 0.5


def test_fit_exact_and_quality_fields() -> None:
    samples = [(0, 10.0), (1000, 12.0), (1_000_000, 2010.0)]
    model, q = fit_linear(samples, workers=2)
    assert model.alpha_us == pytest.approx(10.0)
    assert model.beta_us_per_byte == pytest.approx(0.002)
    assert isinstance(q, FitQuality)
    assert q.r2 == pytest.approx(1.0)
    assert q.max_rel_error == pytest.approx(0.0, abs=1e-9)


def test_fit_clamps_alpha_at_zero() -> None:
    # Data that an unconstrained fit would give a negative intercept.
    samples = [(1000, 0.5), (2000, 2.0), (3000, 3.5)]
    model, q = fit_linear(samples, workers=2)
    assert model.alpha_us == 0.0
    assert model.beta_us_per_byte > 0
    assert q.r2 < 1.0


@pytest.mark.parametrize(
    ("samples", "match"),
    [
        ([(100, 1.0)], "two or more distinct sizes"),
        ([(100, 1.0), (100, 2.0)], "two or more distinct sizes"),
        ([(100, 1.0), (-5, 2.0)], r"samples: \[1\]: bytes must be an integer >= 0"),
        ([(100, 1.0), (5.5, 2.0)], r"samples: \[1\]: bytes must be an integer"),
        ([(100, float("nan")), (5, 2.0)], r"samples: \[0\]: us must be a finite number"),
        ([(100, -1.0), (5, 2.0)], r"samples: \[0\]: us must be >= 0"),
        ([(100, True), (5, 2.0)], r"samples: \[0\]: us must be a finite number"),
    ],
)
def test_fit_rejects_bad_samples(samples: list[tuple[int, float]], match: str) -> None:
    with pytest.raises(InputError, match=match):
        fit_linear(samples, workers=2)
