"""Atomic writes (``pace.io.write_atomic``): a reader sees the old file or the new one.

The kill tests SIGKILL a writer at random points and read the file back: with the atomic writer
it is always the old or the new content, a valid schedule; the same harness catches the naive
writer pace had before (truncate, then write) leaving a truncated or empty file, so it can fail.
"""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pace.errors import InputError
from pace.io import load_schedule, load_trace, write_atomic

DATA = Path(__file__).parent / "data"
TINY = DATA / "tiny.trace.json"
TINY_SCHEDULE = DATA / "tiny.schedule.json"
REPO = Path(__file__).resolve().parent.parent
RESNET = REPO / "traces" / "resnet50.json.gz"

# Writes A and B in turn for ever; "ready" once both are in memory.
_WRITER = """
import sys
from pace.io import write_atomic
path, a, b, mode = sys.argv[1:5]
data = [open(a, "rb").read(), open(b, "rb").read()]
print("ready", flush=True)
i = 0
while True:
    if mode == "atomic":
        write_atomic(path, data[i % 2])
    else:  # what every pace writer did before: truncate, then write
        with open(path, "wb") as fh:
            fh.write(data[i % 2])
    i += 1
"""


def _schedules(tmp_path: Path) -> tuple[bytes, bytes]:
    """Two valid schedules of the tiny trace, 4 MB each (a padded meta), so that a write takes
    long enough for a kill to land inside it."""
    base = json.loads(TINY_SCHEDULE.read_text())
    out = []
    for tag in "AB":
        base["meta"] = {"version": tag, "pad": tag * (4 << 20)}
        out.append(json.dumps(base).encode())
    return out[0], out[1]


def _kill_writer_repeatedly(tmp_path: Path, mode: str, kills: int, seed: int) -> list[bytes]:
    a, b = _schedules(tmp_path)
    (tmp_path / "a").write_bytes(a)
    (tmp_path / "b").write_bytes(b)
    target = tmp_path / "schedule.json"
    target.write_bytes(a)
    rng = random.Random(seed)
    seen = []
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    files = [str(target), str(tmp_path / "a"), str(tmp_path / "b")]
    for _ in range(kills):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, *files, mode],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.0, 0.08))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        seen.append(target.read_bytes())
    return seen


@pytest.mark.slow
def test_killed_writer_leaves_old_or_new_file(tmp_path: Path) -> None:
    a, b = _schedules(tmp_path)
    seen = _kill_writer_repeatedly(tmp_path, "atomic", kills=40, seed=1)
    assert all(content in (a, b) for content in seen)
    # Both versions were seen: the kills did land at different points of the loop.
    assert a in seen
    assert b in seen
    load_schedule(tmp_path / "schedule.json", trace=load_trace(TINY))


@pytest.mark.slow
def test_the_kill_harness_catches_a_naive_writer(tmp_path: Path) -> None:
    a, b = _schedules(tmp_path)
    seen = _kill_writer_repeatedly(tmp_path, "naive", kills=40, seed=1)
    broken = [c for c in seen if c not in (a, b)]
    assert broken, "no kill hit a truncate-then-write writer mid-way: the harness proves nothing"


@pytest.mark.slow
def test_killed_compile_keeps_a_valid_schedule(tmp_path: Path) -> None:
    """``pace compile -o S`` SIGKILLed at random points: S is the old schedule or the new one."""
    out = tmp_path / "s.json"
    old = TINY_SCHEDULE.read_bytes()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "pace", "compile", str(RESNET), "-o", str(out), "--json"]

    def start() -> subprocess.Popen[bytes]:
        out.write_bytes(old)
        return subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO, env=env
        )

    # One run to the end: how long a compile takes here, and what it writes is valid.
    t0 = time.perf_counter()
    assert start().wait(timeout=120) == 0
    full_s = time.perf_counter() - t0
    load_schedule(out, trace=load_trace(RESNET))
    rng = random.Random(5)
    for _ in range(8):
        proc = start()
        time.sleep(rng.uniform(0.1, full_s))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        if out.read_bytes() != old:
            load_schedule(out, trace=load_trace(RESNET))


# ------------------------------------------------------------------------------ write_atomic


def test_replaces_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(b"old")
    write_atomic(path, b"new")
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_new_file_gets_the_umask_and_an_old_one_keeps_its_mode(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    fresh = tmp_path / "fresh"
    write_atomic(fresh, b"x")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask
    kept = tmp_path / "kept"
    kept.write_bytes(b"x")
    kept.chmod(0o640)
    write_atomic(kept, b"y")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640


def test_a_symlink_keeps_pointing_at_the_new_file(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_bytes(b"old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_atomic(link, b"new")
    assert link.is_symlink()
    assert real.read_bytes() == b"new"


def test_a_device_is_written_in_place() -> None:
    write_atomic(os.devnull, b"discarded")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.parametrize("name", ["", "dir", "missing/f.json"])
def test_unwritable_targets_name_the_path(tmp_path: Path, name: str) -> None:
    (tmp_path / "dir").mkdir()
    path = str(tmp_path / name) if name else ""
    with pytest.raises(InputError) as info:
        write_atomic(path, b"x")
    assert info.value.where == (path or "''")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("failure", [KeyboardInterrupt, OSError(28, "No space left on device")])
def test_failure_mid_write_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(b"old")

    def fail(fd: int) -> None:
        raise failure

    monkeypatch.setattr(os, "fsync", fail)
    expected = KeyboardInterrupt if failure is KeyboardInterrupt else InputError
    with pytest.raises(expected):
        write_atomic(path, b"new")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
