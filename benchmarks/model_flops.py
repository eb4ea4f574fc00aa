"""Training FLOPs of one iteration of each shipped trace's model, at the batch it was profiled with.

    python benchmarks/model_flops.py

Counts forward + loss + backward with ``torch.utils.flop_counter.FlopCounterMode`` on the
``meta`` device (no computation runs; a few seconds in all). The models and batches are those of
``traces/README.md``. ``bench_sweep.py`` uses these counts to give every trace a GPU-class compute
time (its ``CALIBRATION`` table records the figures this script printed).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# name -> (workload spec, build_workload keyword arguments), as in traces/README.md.
MODELS: dict[str, tuple[str, dict[str, int]]] = {
    "vgg16": ("torchvision:vgg16", {"batch_size": 8, "image_size": 224}),
    "resnet50": ("torchvision:resnet50", {"batch_size": 32, "image_size": 224}),
    "transformer": ("pace:transformer", {"batch_size": 16, "seq_len": 64}),
    "lstm_seq2seq": ("pace:lstm-seq2seq", {"batch_size": 32, "seq_len": 32}),
}


def training_gflop(spec: str, kwargs: dict[str, int]) -> float:
    """FLOPs (in 1e9) of one forward + backward pass of ``spec`` built with ``kwargs``."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from pace.profiler.workloads import build_workload

    torch.set_num_threads(1)
    work = build_workload(spec, device="meta", **kwargs)
    counter = FlopCounterMode(display=False)
    with counter:
        work.step_fn(work.model).backward()  # type: ignore[no-untyped-call]
    return float(counter.get_total_flops()) / 1e9


def main() -> None:
    print(f"{'trace':<14} {'model':<22} {'batch':<28} {'train GFLOP/iter':>16}")
    for name, (spec, kwargs) in MODELS.items():
        batch = ", ".join(f"{k}={v}" for k, v in kwargs.items())
        print(f"{name:<14} {spec:<22} {batch:<28} {training_gflop(spec, kwargs):>16.2f}")


if __name__ == "__main__":
    main()
