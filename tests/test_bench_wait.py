"""benchmarks/bench_wait.py: each wait does what its name says, the head is the k-th gradient
after the forward's end, and a short real run fills every mode's rows."""

from __future__ import annotations

import time

import pytest

from benchmarks import bench_wait


@pytest.mark.parametrize("mode", ["sleep", "spin", "stream"])
def test_each_wait_lasts_as_asked(mode: str) -> None:
    calls: list[int] = []
    start = time.perf_counter()
    cpu = time.thread_time()
    passes = bench_wait.wait(mode, 0.05, lambda: calls.append(1))
    assert time.perf_counter() - start >= 0.05
    spent_cpu = time.thread_time() - cpu
    if mode == "spin":
        assert spent_cpu >= 0.03  # the training thread itself kept the core busy
    else:
        assert spent_cpu < 0.03  # it slept
    if mode == "stream":
        assert passes == len(calls) > 0  # the second thread streamed while it slept
    else:
        assert passes == 0
        assert not calls


def test_warm_does_not_wait_and_bad_modes_are_refused() -> None:
    start = time.perf_counter()
    assert bench_wait.wait("warm", 5.0) == 0
    assert time.perf_counter() - start < 1.0
    with pytest.raises(ValueError, match="unknown wait mode"):
        bench_wait.wait("nap", 0.0)
    with pytest.raises(ValueError, match="needs work"):
        bench_wait.wait("stream", 0.0)


def test_head_is_the_kth_gradient_after_the_forward() -> None:
    # Unsorted, with one stamp before the forward's end (a previous backward's): not counted.
    stamps = [10.030, 9.990, 10.004, 10.012]
    assert bench_wait.head_ms(stamps, 10.0, 1) == pytest.approx(4.0)
    assert bench_wait.head_ms(stamps, 10.0, 3) == pytest.approx(30.0)
    with pytest.raises(ValueError, match="3 gradients after the forward"):
        bench_wait.head_ms(stamps, 10.0, 4)


def test_table_gives_medians_iqrs_and_ratios_to_warm() -> None:
    rows = {
        "warm": [(100.0, 20.0, 300.0), (110.0, 22.0, 310.0), (120.0, 24.0, 320.0)],
        "sleep": [(120.0, 30.0, 330.0), (132.0, 33.0, 340.0), (144.0, 36.0, 350.0)],
    }
    lines = bench_wait.table(rows).splitlines()
    assert lines[2] == "| warm | 110.0 (10.0) | 22.0 (2.0) | 310.0 (10.0) | 1.000 | 1.000 | 3 |"
    assert lines[3] == "| sleep | 132.0 (12.0) | 33.0 (3.0) | 340.0 (10.0) | 1.200 | 1.500 | 3 |"


def test_a_short_run_times_every_mode() -> None:
    rows = bench_wait.measure(rounds=2, wait_s=0.001, gradient=3)
    assert list(rows) == list(bench_wait.MODES)
    for got in rows.values():
        assert len(got) == 2
        for forward_ms, head, backward_ms in got:
            assert forward_ms > 0
            assert 0 < head < backward_ms
