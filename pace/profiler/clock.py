"""Clocks the recorder stamps ops with: host time on the CPU, CUDA events on a GPU.

Both expose the same two calls: ``mark()`` takes a time stamp now (on the host, or enqueued on the
current CUDA stream) and ``resolve(marks)`` turns a list of stamps into nanoseconds relative to the
first one. Stamps are resolved once per iteration, so a CUDA run synchronises once per iteration and
not once per op (which would serialise the host and the device and distort the timings).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol


class Clock(Protocol):
    """Where op start/end stamps come from."""

    name: str

    def mark(self) -> Any:
        """A time stamp taken now (opaque)."""
        ...

    def resolve(self, marks: Sequence[Any]) -> list[float]:
        """``marks`` as nanoseconds since ``marks[0]``."""
        ...


class HostClock:
    """``time.perf_counter_ns``: the right clock for CPU ops, which run synchronously."""

    name = "host"

    def mark(self) -> int:
        return time.perf_counter_ns()

    def resolve(self, marks: Sequence[Any]) -> list[float]:
        if not marks:
            return []
        base = int(marks[0])
        return [float(int(m) - base) for m in marks]


class CudaEventClock:
    """CUDA events on the current stream of the model's device: device time, unaffected by
    host-side launch overhead.

    ``device`` (``cuda``, ``cuda:N``; default the current device) is the device whose current
    stream the events are recorded on: with ``--device cuda:1`` the thread's current device may
    still be 0, and an event recorded there would time nothing the model runs. Checked on an
    H100 (docs/gpu.md).
    """

    name = "cuda-events"

    def __init__(self, device: str | None = None) -> None:
        import torch

        self._torch = torch
        self._device = device

    def mark(self) -> Any:
        ev = self._torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        if self._device is None:
            ev.record()
        else:
            # The current stream of the model's device, in the calling thread: autograd's
            # device thread (backward hooks) has it set to the forward's stream.
            ev.record(self._torch.cuda.current_stream(self._device))
        return ev

    def resolve(self, marks: Sequence[Any]) -> list[float]:
        if not marks:
            return []
        if self._device is None:
            self._torch.cuda.synchronize()
        else:
            self._torch.cuda.synchronize(self._device)
        base = marks[0]
        # elapsed_time is in milliseconds with ~0.5 us resolution.
        return [float(base.elapsed_time(m)) * 1e6 for m in marks]


def clock_for(device: str) -> Clock:
    """The clock that measures ops on ``device`` (``cpu`` or ``cuda[:n]``)."""
    if device.startswith("cuda"):
        return CudaEventClock(device)
    return HostClock()
