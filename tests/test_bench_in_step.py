"""benchmarks/bench_in_step.py: a short real run times every way, the slower process's spans."""

from __future__ import annotations

import pytest

from benchmarks import bench_in_step


@pytest.mark.slow
def test_every_way_trains_and_the_table_has_a_row_each(capsys: pytest.CaptureFixture[str]) -> None:
    spans = bench_in_step.run_way("in step", 2, 2)
    assert len(spans) == 2  # one per counted iteration: the slower process's
    assert all(len(s) == 3 and all(ms > 0 for ms in s) for s in spans)
    assert bench_in_step.main(["--iterations", "2", "--repeats", "1", "--batch", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == [f"| {w}" for w in bench_in_step.WAYS]
    assert lines[3].endswith("| 1.000x |")  # `free` against itself
