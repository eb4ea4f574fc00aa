"""How bench_netns orders a Horovod launch's blocks and runs a failed launch again."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.bench_netns import (
    DEFAULT_SETTINGS_VARIANTS,
    LaunchFailedError,
    _horovod_settings,
    by_settings,
    run_attempts,
)

VARIANTS = [
    "vanilla",
    "local@vanilla",
    "vanilla-nofusion",
    "online",
    "pace",
    "pace-sync",
    "pace@cal",
    "local",
]


def _switches(order: list[str], blocks: int, on_framework: frozenset[str]) -> int:
    """Re-initialisations a launch makes: the blocks alternate direction (worker_train)."""
    passes = [order if b % 2 == 0 else order[::-1] for b in range(blocks)]
    settings = [_horovod_settings(k, on_framework) for k in itertools.chain(*passes)]
    return sum(a != b for a, b in itertools.pairwise(settings))


@given(
    kinds=st.permutations(VARIANTS),
    on_framework=st.sets(st.sampled_from(["pace", "pace-sync", "pace@cal"])),
    blocks=st.integers(1, 8),
)
def test_grouped_blocks_switch_settings_at_most_once_per_pass(
    kinds: list[str], on_framework: set[str], blocks: int
) -> None:
    fw = frozenset(on_framework)
    order = by_settings(kinds, fw)
    assert sorted(order) == sorted(kinds)  # every variant, once
    under_defaults = [k in DEFAULT_SETTINGS_VARIANTS or k in fw for k in order]
    assert under_defaults == sorted(under_defaults, reverse=True)  # defaults first
    # Each group keeps the order it was given in.
    for group in (True, False):
        given_order = [k for k in kinds if (k in DEFAULT_SETTINGS_VARIANTS or k in fw) == group]
        assert [k for k, d in zip(order, under_defaults, strict=True) if d == group] == given_order
    assert _switches(order, blocks, fw) <= blocks
    assert _switches(order, blocks, fw) <= _switches(kinds, blocks, fw)


def test_the_launchs_own_order_with_pace_on_horovods_path_switched_three_times_a_pass() -> None:
    fw = frozenset({"pace"})
    assert _switches(VARIANTS, 1, fw) == 3
    assert _switches(by_settings(VARIANTS, fw), 1, fw) == 1


def _flaky(tmp_path: Path) -> list[str]:
    """A process that aborts on its first run and succeeds on the next."""
    marker = tmp_path / "ran"
    code = (
        "import os, pathlib, signal, sys\n"
        f"m = pathlib.Path({str(marker)!r})\n"
        "if not m.exists():\n"
        "    m.write_text('1')\n"
        "    os.kill(os.getpid(), signal.SIGABRT)\n"
        f"pathlib.Path({str(tmp_path / 'done')!r}).write_text('ok')\n"
    )
    return [sys.executable, "-c", code]


def test_a_launch_that_crashes_once_runs_again_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cmd = _flaky(tmp_path)
    run_attempts(lambda: [subprocess.Popen(cmd)], 2)
    assert (tmp_path / "done").read_text() == "ok"
    out = capsys.readouterr().err  # _say writes to stderr
    assert "SIGABRT" in out
    assert "running it again (2 of 2)" in out


def test_a_launch_that_crashes_every_time_fails_with_the_signal(tmp_path: Path) -> None:
    cmd = _flaky(tmp_path)
    with pytest.raises(LaunchFailedError, match="SIGABRT"):
        run_attempts(lambda: [subprocess.Popen(cmd)], 1)
    assert not (tmp_path / "done").exists()


def test_a_launch_that_times_out_is_not_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import benchmarks.bench_netns as bench

    monkeypatch.setattr(bench, "LAUNCH_TIMEOUT_S", 0.5)
    started = []

    def start() -> list[subprocess.Popen[bytes]]:
        started.append(1)
        return [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])]

    with pytest.raises(RuntimeError, match="did not finish") as err:
        run_attempts(start, 3)
    assert not isinstance(err.value, LaunchFailedError)
    assert len(started) == 1
