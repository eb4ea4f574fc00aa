"""The throttled-link benchmark's machinery (benchmarks/bench_netns.py): namespaces, tc, launches.

These need root and iproute2 (``ip netns``, ``tc``), as the benchmark does; CI runs as root.
No timing is asserted: only that the link is made as asked, is always removed, and that real
2-rank Horovod and torch.distributed jobs run across it and the pace runtime trains over it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import bench_netns
from benchmarks.bench_netns import Link, launch, set_rate, throttled_link

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="needs root and iproute2 (ip netns, tc)",
)


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def _qdisc(link: Link, r: int) -> str:
    cmd = ["tc", "-n", link.ns[r], "qdisc", "show", "dev", link.dev[r]]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def _check_link(link: Link) -> None:
    assert set(link.ns) <= _namespaces()
    set_rate(link, "100mbit")
    for r in (0, 1):
        assert "tbf" in _qdisc(link, r)
        assert "100Mbit" in _qdisc(link, r)
        hosts = (bench_netns.NETNS_ETC / link.ns[r] / "hosts").read_text()
        assert link.ip[r] in hosts
    set_rate(link, "2gbit")  # replaced, not stacked
    assert "2Gbit" in _qdisc(link, 0)
    assert _qdisc(link, 0).count("qdisc tbf") == 1
    # The namespaces reach each other over the pair: the peer answers (nothing listens on 9).
    cmd = ["ip", "netns", "exec", link.ns[0], "python3", "-c"]
    cmd.append(f"import socket; socket.create_connection(('{link.ip[1]}', 9), timeout=2)")
    refused = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert "ConnectionRefused" in refused.stderr


def test_link_is_made_throttled_and_always_removed() -> None:
    made: list[Link] = []
    # The exit path is what is tested: an error inside must still remove everything.
    with pytest.raises(RuntimeError, match="boom"), throttled_link() as link:  # noqa: PT012
        made.append(link)
        _check_link(link)
        raise RuntimeError("boom")
    assert not set(made[0].ns) & _namespaces()
    assert not (bench_netns.NETNS_ETC / made[0].ns[0]).exists()


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.parametrize("backend", ["horovod", "torch"])
def test_two_ranks_all_reduce_across_the_namespaces(backend: str, tmp_path: Path) -> None:
    pytest.importorskip("horovod.torch" if backend == "horovod" else "torch")
    out = tmp_path / "samples.json"
    argv = ["--role", "comm", "--backend", backend, "--out", str(out)]
    argv += ["--sizes", "4096,65536", "--reps", "2"]
    with throttled_link() as link:
        set_rate(link, "500mbit")
        launch(link, backend, argv, bench_netns.pace_horovod_env())
    samples = json.loads(out.read_text())
    assert [b for b, _, _ in samples] == [4096, 65536]
    assert all(us > 0 and cpu_us >= 0 for _, us, cpu_us in samples)


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.parametrize("backend", ["horovod", "torch"])
def test_the_runtime_trains_vgg_over_the_link(backend: str, tmp_path: Path) -> None:
    pytest.importorskip("horovod.torch" if backend == "horovod" else "torch")
    from pace.compiler import compile_trace
    from pace.io import save_schedule
    from pace.ir import CommModel

    trace = bench_netns.profile_trace(2, tmp_path / "vgg.trace.json.gz")
    sched = tmp_path / "vgg.schedule.json"
    comm = CommModel(workers=2, alpha_us=500.0, beta_us_per_byte=8e-3)
    schedule = compile_trace(dataclasses.replace(trace, comm=comm)).schedule
    save_schedule(schedule, sched)
    out = tmp_path / "periods.json"
    argv = ["--role", "train", "--backend", backend, "--schedule", str(sched)]
    argv += ["--batch", "2", "--blocks", "2", "--steps", "2", "--out", str(out)]
    # Another schedule of the replay's mode trains as a variant of its own (--compare-hedge's
    # `pace-nohedge`; here the same file).
    argv += ["--nohedge-schedule", str(sched)]
    argv += ["--variants", f"vanilla,online,pace,{bench_netns.NOHEDGE_VARIANT},local,local-free"]
    with throttled_link() as link:
        set_rate(link, "1gbit")
        launch(link, backend, argv, bench_netns.pace_horovod_env())
    periods = json.loads(out.read_text())
    assert set(periods) == {"vanilla", "online", "pace", "pace-nohedge", "local", "local-free"}
    assert all(len(v) == 4 and all(p > 0 for p in v) for v in periods.values())
    # Each timed block's lead-in iteration (it starts with nothing in flight) is kept apart.
    lead_in = json.loads(Path(f"{out}.lead_in").read_text())
    assert {k: len(v) for k, v in lead_in.items()} == dict.fromkeys(periods, 2)
    # Every rank timed its periods; `local` is read per iteration from the slower rank.
    launched = bench_netns.read_launch(out)
    assert launched["pace"] == periods["pace"]
    assert all(a >= b for a, b in zip(launched["local"], periods["local"], strict=True))
    # `local` runs its ranks in step (a barrier before each iteration): no rank starts an
    # iteration before every rank has ended the one before (one clock for the host's ranks),
    # and its periods are the iterations' compute, not the barrier's wait.
    per_block = bench_netns.iterations_per_block(2)
    marks = [json.loads(Path(f"{out}.local.marks.rank{r}").read_text()) for r in range(2)]
    assert len(marks[0]) == len(marks[1]) == 2 * per_block  # every iteration of timed blocks
    for i, (before, after) in enumerate(itertools.pairwise(zip(*marks, strict=True))):
        if (i + 1) % per_block:  # the same block
            assert min(m[0] for m in after) >= max(m[2] for m in before)
    phases = json.loads(Path(f"{out}.phases").read_text())
    for p, (fw, bw, st) in zip(periods["local"], phases["local"], strict=True):
        assert p == pytest.approx(fw + bw + st, abs=1e-6)
    # Every rank logged the runtime's units; lined up, they give each unit's channel time.
    for variant in ("online", "pace", "pace-nohedge"):
        logs = bench_netns.read_unit_logs(Path(f"{out}.{variant}.units"))
        assert logs is not None
        assert len(logs) == 2
        merged = bench_netns.merged_units(logs)
        assert merged
        # Every iteration of the timed blocks logged its units, the lead-in and the last too:
        # what the channel time per iteration divides by.
        if variant != "online":
            assert len(merged) == 2 * per_block * len(schedule.units)
        assert all(us > 0 for _, us in merged)
        # Each rank marked every iteration of the timed blocks: where the channel idled.
        idle = bench_netns._idle_of(out.with_name(f"{out.name}.{variant}"), per_block)
        assert idle is not None
        assert min(idle.tail_ms, idle.head_ms, idle.within_ms) >= 0
        # ... and, with every rank's gradients' times, the head's parts on the later rank.
        head = (idle.head_backward_ms, idle.head_dispatch_ms, idle.head_skew_ms)
        assert all(x is not None and x >= 0 for x in head)
    # The host's cores were busy in every variant's blocks (two ranks training on them), and
    # no more than all of them.
    cpu = bench_netns.read_cpu(Path(f"{out}.cpu"), os.cpu_count() or 1)
    assert set(cpu) == set(periods)
    assert all(core_ms > 0 and 0 < busy <= 1.1 for core_ms, busy in cpu.values())  # ticks
    if backend == "horovod":
        # One launch: vanilla's blocks re-initialised Horovod with its defaults, the others
        # with the runtime's fusion and cache off.
        settings = json.loads(Path(f"{out}.settings").read_text())
        off = {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CACHE_CAPACITY": "0"}
        assert settings["vanilla"] == dict.fromkeys(off)
        assert settings["pace"] == settings["online"] == settings["local"] == off
        assert settings["pace-nohedge"] == off


@pytest.mark.slow
@pytest.mark.horovod
def test_a_horovod_launch_runs_another_script_on_both_ranks(tmp_path: Path) -> None:
    """The rendezvous driver starts the script it is given (bench_sync_forward.py's worker
    here), not this module, in both namespaces."""
    pytest.importorskip("horovod.torch")
    from benchmarks import bench_sync_forward

    argv = ["--worker", "--batch", "2", "--blocks", "1", "--steps-per-block", "1"]
    with throttled_link() as link:
        set_rate(link, "1gbit")
        launch(link, "horovod", [*argv, "--out", str(tmp_path)], script=bench_sync_forward.__file__)
    for r in (0, 1):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert set(res) == set(bench_sync_forward.KINDS)
        for kind in bench_sync_forward.KINDS:
            values = res[kind]["values"]
            assert len(values) == len(bench_sync_forward.FIELDS)
            assert values[0] > 0  # the forward took time
            # Horovod's threads run beside every forward, `local`'s too.
            assert any(name.startswith("horovod") for name, _, _ in res[kind]["top"])
