"""Does one rank's first all-reduce slow the other rank's backward while that one catches up?

On the throttled link (``bench_netns.py``'s network namespaces, a ``tc``-limited veth pair, as
root), 2 gloo ranks train VGG-CIFAR (batch 10, one thread each) and, in each iteration's
backward, all-reduce the gradients in two units: the first once its gradients (the last
``--first`` parameters, the classifier's) are ready, the rest after the backward, the way the
runtime's replay issues a schedule. Blocks of three modes alternate in one launch:

- ``local``: no all-reduce (the ranks meet at a barrier before each iteration);
- ``early``: each rank issues the first unit as soon as its gradients are ready, so the rank
  that gets there first starts sending while the other still computes;
- ``rendezvous``: each rank first all-reduces one element and waits for it, then issues the
  first unit: nothing flows until both ranks are ready.

    python benchmarks/bench_head_rendezvous.py [--rates 1gbit,2gbit] [--blocks 8] [--steps 8]

Per mode, medians over the counted iterations (a block's first is not counted): the head of
the rank that issued the first unit last (from its forward's end to its last gradient of the
unit), the other rank's, the ranks' skew at the issue, the channel's head (from the later
forward's end to the later issue: when the unit could start), and the iteration (from the
earlier start to the later end), with its IQR. Why: in every overlapped run of
``bench_netns.py`` the head of the rank the channel waited for ran 2-24 ms slower than `local`'s
slower rank while the other rank's ran near `local`'s faster rank's (docs/results.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))  # run as a script from a checkout

MODES = ("local", "early", "rendezvous")
HEAD_COLUMNS = ("rate", "mode", "head (issued last)", "head (other rank)", "skew", "channel head")
HEAD_KEYS = ("behind", "ahead", "skew", "channel")  # ``summary``'s, in HEAD_COLUMNS' order
BATCH = 10


def worker(out: str, blocks: int, steps: int, first: int) -> None:
    import torch
    import torch.distributed as dist

    from pace.profiler.workloads import vgg_cifar

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    # One worker thread: collectives run in issue order, as the runtime's gloo group does.
    group = dist.new_group(backend="gloo")
    assert isinstance(group, dist.ProcessGroup)  # a member: never the sentinel
    torch.manual_seed(0)
    model = vgg_cifar()
    x, y = torch.randn(BATCH, 3, 32, 32), torch.randint(0, 10, (BATCH,))
    params = list(model.parameters())
    head, rest = params[-first:], params[:-first]
    marked: dict[int, float] = {}
    head_ready, all_ready = threading.Event(), threading.Event()

    def hook(p: torch.Tensor) -> None:
        marked[id(p)] = time.perf_counter()
        if not head_ready.is_set() and all(id(q) in marked for q in head):
            head_ready.set()
        if len(marked) == len(params):
            all_ready.set()

    for p in params:
        p.register_post_accumulate_grad_hook(hook)  # type: ignore[no-untyped-call]
    issued: list[float] = []

    def dispatch(mode: str) -> None:
        head_ready.wait()
        if mode == "rendezvous":
            dist.all_reduce(torch.zeros(1), group=group)
        issued.append(time.perf_counter())
        grads = [p.grad for p in head]
        assert all(g is not None for g in grads)
        first_unit = torch.cat([g.reshape(-1) for g in grads if g is not None])
        work = dist.all_reduce(first_unit, group=group, async_op=True)
        all_ready.wait()
        second = torch.cat([p.grad.reshape(-1) for p in rest if p.grad is not None])
        dist.all_reduce(second, group=group)
        assert work is not None
        work.wait()

    rows: list[dict[str, Any]] = []
    for block in range(blocks):
        for mode in MODES:
            for it in range(steps + 1):
                marked.clear()
                head_ready.clear()
                all_ready.clear()
                issued.clear()
                dist.barrier()
                thread = None
                if mode != "local":
                    thread = threading.Thread(target=dispatch, args=(mode,))
                    thread.start()
                start = time.perf_counter()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                forward_end = time.perf_counter()
                model.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                if thread is not None:
                    thread.join()
                end = time.perf_counter()
                head_end = max(marked[id(q)] for q in head)
                if it:  # a block's first iteration warms up
                    rows.append(
                        {
                            "mode": mode,
                            "block": block,
                            "start": start,
                            "forward_end": forward_end,
                            "head_end": head_end,
                            "issue": issued[0] if issued else head_end,
                            "end": end,
                        }
                    )
    gathered: list[Any] = [None, None]
    dist.all_gather_object(gathered, rows)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def summary(ranks: list[list[dict[str, Any]]], mode: str) -> dict[str, list[float]]:
    """Per counted iteration of ``mode`` (both ranks' rows), ms: the later-issuing rank's head,
    the other's, the skew, the channel's head and the iteration."""
    out: dict[str, list[float]] = {k: [] for k in (*HEAD_KEYS, "it")}
    for a, b in zip(*ranks, strict=True):
        if a["mode"] != mode:
            continue
        late, early = (a, b) if a["issue"] >= b["issue"] else (b, a)
        out["behind"].append((late["head_end"] - late["forward_end"]) * 1e3)
        out["ahead"].append((early["head_end"] - early["forward_end"]) * 1e3)
        out["skew"].append((late["issue"] - early["issue"]) * 1e3)
        out["channel"].append((late["issue"] - max(a["forward_end"], b["forward_end"])) * 1e3)
        out["it"].append((max(a["end"], b["end"]) - min(a["start"], b["start"])) * 1e3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1gbit,2gbit")
    ap.add_argument("--blocks", type=int, default=8, help="blocks of the three modes")
    ap.add_argument("--steps", type=int, default=8, help="counted iterations per block")
    ap.add_argument("--first", type=int, default=4, help="parameters in the first unit")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args, _ = ap.parse_known_args()
    if args.worker_out:
        worker(args.worker_out, args.blocks, args.steps, args.first)
        return 0
    if args.blocks < 1 or args.steps < 1 or args.first < 1:
        ap.error("--blocks, --steps and --first must be >= 1")
    if os.geteuid() != 0:
        print("bench_head_rendezvous: needs root (ip netns, tc)", file=sys.stderr)
        return 2
    import bench_netns

    from benchmarks._common import iqr
    from pace.cli._output import print_table

    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp, bench_netns.throttled_link() as link:
        for rate in args.rates.split(","):
            bench_netns.set_rate(link, rate)
            out = str(Path(tmp) / f"{rate}.json")
            argv = ["--worker-out", out, "--blocks", str(args.blocks)]
            argv += ["--steps", str(args.steps), "--first", str(args.first)]
            bench_netns.launch(link, "torch", argv, script=__file__)
            ranks = json.loads(Path(out).read_text())
            for mode in MODES:
                got = summary(ranks, mode)
                cells = [f"{statistics.median(got[k]):.1f}" for k in HEAD_KEYS]
                it = f"{statistics.median(got['it']):.1f} ({iqr(got['it']):.1f})"
                rows.append([rate, mode, *cells, it, len(got["it"])])
    print_table(
        f"2 gloo ranks, VGG-CIFAR batch {BATCH}, the first unit the last {args.first} "
        "parameters; medians over the counted iterations, ms",
        [*HEAD_COLUMNS, "iteration (IQR)", "iterations"],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
