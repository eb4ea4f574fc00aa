"""The throttled-link benchmark's report arithmetic (benchmarks/bench_netns.py), no link needed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.bench_netns import Row, ranking_agreement


def _row(variant: str, measured: float, iqr: float, predicted: float, rate: str = "1gbit") -> Row:
    return Row(
        rate=rate,
        backend="torch",
        variant=variant,
        measured_ms=measured,
        spread_ms=iqr,
        predicted_ms=predicted,
        independent_ms=None,
    )


def test_ranking_counts_only_pairs_the_run_can_tell_apart() -> None:
    rows = [
        _row("vanilla", 700.0, 40.0, 650.0),
        _row("pace", 600.0, 40.0, 560.0),  # 100 ms apart: resolved, same order
        _row("online", 610.0, 40.0, 700.0),  # 10 ms from pace: within the spread
        _row("local", 400.0, 10.0, 380.0),  # calibrates, never ranked
        _row("pace", 100.0, 1.0, 900.0, rate="2gbit"),  # another rate: never paired
    ]
    agree, against, close = ranking_agreement(rows)
    assert agree == ["1gbit torch vanilla/pace"]
    assert against == ["1gbit torch vanilla/online"]  # 90 ms apart, predicted the other way
    assert close == 1


@given(
    st.lists(
        st.tuples(st.floats(100, 1000), st.floats(0, 200), st.floats(100, 1000)),
        min_size=2,
        max_size=6,
    )
)
def test_every_pair_is_counted_once_and_a_perfect_model_always_agrees(
    cells: list[tuple[float, float, float]],
) -> None:
    rows = [_row(f"v{i}", m, iqr, p) for i, (m, iqr, p) in enumerate(cells)]
    agree, against, close = ranking_agreement(rows)
    n = len(rows)
    assert len(agree) + len(against) + close == n * (n - 1) // 2
    exact = [_row(f"v{i}", m, iqr, m) for i, (m, iqr, _) in enumerate(cells)]
    assert ranking_agreement(exact)[1] == []
