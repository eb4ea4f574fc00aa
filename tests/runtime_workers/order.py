"""Run by tests/test_backend_order.py under ``torchrun --nproc-per-node 2``: does a group run
two started all-reduces one after the other? A large one is started, then a tiny one; once the
tiny one is done, is the large one done too? Printed per rank, for the runtime's torch backend
and for a plain ``new_group`` (torch's two gloo worker threads) as the control."""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from pace.runtime.backends import TorchBackend

TRIALS = 5
BIG = 8 * 2**20  # floats: 32 MiB, tens of ms on loopback
TINY = 16


def large_done_first(start: Any, wait: Any, done: Any) -> list[bool]:
    out = []
    for _ in range(TRIALS):
        big, tiny = torch.ones(BIG), torch.ones(TINY)
        hb = start(big)
        ht = start(tiny)
        wait(ht)
        out.append(bool(done(hb)))
        wait(hb)
    return out


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    backend = TorchBackend()
    ours = large_done_first(
        lambda t: backend.start(t, "order"),
        lambda h: backend.wait(h, 60.0),
        lambda h: h[0].is_completed(),
    )
    control_group = dist.new_group(backend="gloo")
    control = large_done_first(
        lambda t: dist.all_reduce(t, group=control_group, async_op=True),
        lambda h: h.wait(),
        lambda h: h.is_completed(),
    )
    result = {"rank": dist.get_rank(), "in_order": backend.in_order, "ours": ours}
    result["control"] = control
    print("PACE_ORDER " + json.dumps(result), flush=True)
    backend.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
