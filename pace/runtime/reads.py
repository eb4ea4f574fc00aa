"""Parameters read where no module's forward pre-hook waits for their update (overlapped mode).

The overlapped mode updates a parameter in the background and makes the forward of the module
that owns it wait for that update (a forward pre-hook). A loop may read a parameter elsewhere:

* in the forward, before its module runs: ``h + self.child.bias`` in a parent's forward ahead
  of ``self.child``, or a weight shared by reference;
* between ``step()`` and the next forward: an EMA of the weights
  (``torch.optim.swa_utils.AveragedModel.update_parameters``), a parameter or gradient norm
  logged after the step, a copy of the weights.

Such a read would see the previous iteration's value (or a half-written one; a gradient not yet
averaged), silently. ``ReadGuard`` closes the gap: from the end of ``step()`` and during the
wrapped model's forward it sees each torch call on the training thread (a ``TorchFunctionMode``)
and, at the first read of a parameter whose update has not been waited for since, waits for it
before the call runs.

A torch function mode costs about 12 us per torch call on this project's CPU
(``python benchmarks/bench_read_guard.py``), so the guard is on only while an update is in
flight: it is entered at ``step()``'s end only when one is, and it leaves at the first module of
the next forward after which none is (no update starts again before the next backward), at that
forward's end, or at ``synchronize()``.

Modes are a per-thread stack, and leaving one pops the top: the guard leaves only when it is on
top, from the thread that entered it. It is not entered at ``step()``'s end while a mode of the
user's is active (the user's exit would pop the guard instead); ``step()`` then waits for every
update before returning (``after_step``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

Wait = Callable[[Sequence[int], str], None]


class ReadGuard(TorchFunctionMode):
    """Waits for a parameter's update at its first read after ``step()`` or in a forward (see
    the module doc)."""

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        wait: Wait,
        pending: Callable[[], bool],
    ):
        super().__init__()
        self._index = {id(p): i for i, p in enumerate(params)}
        self._names = names
        self._wait = wait
        self._pending = pending  # is any parameter's update still in flight?
        self._waited: set[int] = set()
        self._depth = 0
        self._on = False
        self._thread = 0  # the thread whose mode stack holds the guard while it is on
        self.waited_at_step = 0  # steps that waited for every update (a user's mode was on)

    def waited(self, indices: Iterable[int]) -> None:
        """A module's own pre-hook waited for these parameters in this forward."""
        if self._on:
            self._waited.update(indices)
            if not self._pending():
                self.release()

    def after_step(self) -> None:
        """``step()`` closed an iteration: its updates are in flight until each unit is reduced.
        Guard the reads that follow, up to the next forward."""
        if not self._pending():
            return
        # Every parameter has an update in flight again (or done since): none waited for yet.
        self._waited.clear()
        if self._on:
            return
        if torch._C._len_torch_function_stack() > 0:
            # A mode of the user's is on (around step()): entering above it would make its
            # exit pop the guard. Correct without the guard: every update done now.
            self.waited_at_step += 1
            self._wait(range(len(self._names)), "step() inside a torch function mode")
            return
        self._enter()

    def begin(self) -> None:
        """The wrapped model's forward starts (nested calls count once)."""
        if self._depth == 0:
            if self._on:  # on since step(): what was waited for since then stays waited for
                if not self._pending():
                    self.release()
            elif self._pending():
                self._waited.clear()
                self._enter()
        self._depth += 1

    def end(self) -> None:
        """The wrapped model's forward returned or raised."""
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0:
            self.release()

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Off for the runtime's own work on the training thread (``zero_grad()``: it touches
        only parameters whose update is done), so that it pays no per-call cost."""
        was_on = self._on and self._on_top()
        if was_on:
            self.release()
        try:
            yield
        finally:
            if was_on:
                self._enter()

    def release(self) -> None:
        """Leave if on, on top, and on this thread (else stay on: a later hook leaves)."""
        if self._on and self._on_top():
            self._on = False
            self.__exit__(None, None, None)  # type: ignore[no-untyped-call]

    def _enter(self) -> None:
        self.__enter__()  # type: ignore[no-untyped-call]
        self._on = True
        self._thread = threading.get_ident()

    def _on_top(self) -> bool:
        # Leaving pops the top of this thread's mode stack: not while a mode that the user
        # entered after the guard is above it, nor from another thread's stack.
        if threading.get_ident() != self._thread:
            return False
        n = torch._C._len_torch_function_stack()
        return n > 0 and torch._C._get_function_stack_at(n - 1) is self

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if len(self._waited) < len(self._index):
            self._check(args)
            if kwargs:
                self._check(kwargs.values())
        return func(*args, **kwargs)

    def _check(self, values: Iterable[Any]) -> None:
        for v in values:
            if isinstance(v, torch.nn.Parameter):
                self._first_read(v)
            elif isinstance(v, (list, tuple)):  # TensorList arguments (cat, stack, foreach)
                for w in v:
                    if isinstance(w, torch.nn.Parameter):
                        self._first_read(w)

    def _first_read(self, p: torch.nn.Parameter) -> None:
        i = self._index.get(id(p))
        if i is None or i in self._waited:
            return
        self._waited.add(i)
        self._wait([i], f"read of {self._names[i]!r} while its update was in flight")
