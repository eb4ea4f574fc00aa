"""Parameters read before the forward of the module that owns them (the overlapped mode).

The overlapped mode updates a parameter in the background and makes the forward of the module
that owns it wait for that update (a forward pre-hook). A model may read a parameter elsewhere
first: ``h + self.child.bias`` in a parent's forward before ``self.child`` runs, or a weight
shared by reference. That read would see the previous iteration's value, or a half-written
one, silently. ``ReadGuard`` closes the gap: during every forward of the wrapped model it sees
each torch call (a ``TorchFunctionMode``) and, at the first read of a parameter whose update
this forward has not waited for yet, waits for it before the call runs.

A torch function mode costs about 12 us per torch call on this project's CPU
(``python benchmarks/bench_read_guard.py``), so the guard is on only while an update is in
flight: it is not entered when none is at the forward's start, and it leaves at the first
module of the forward after which none is (no update starts again before the next backward).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

Wait = Callable[[Sequence[int], str], None]


class ReadGuard(TorchFunctionMode):
    """Waits for a parameter's update at its first read in a forward (see the module doc)."""

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

    def waited(self, indices: Iterable[int]) -> None:
        """A module's own pre-hook waited for these parameters in this forward."""
        if self._on:
            self._waited.update(indices)
            if not self._pending() and self._on_top():
                self._leave()

    def begin(self) -> None:
        """The wrapped model's forward starts (nested calls count once)."""
        if self._depth == 0 and self._pending():
            self._waited.clear()
            self.__enter__()  # type: ignore[no-untyped-call]
            self._on = True
        self._depth += 1

    def end(self) -> None:
        """The wrapped model's forward returned or raised."""
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0:
            self._leave()

    def _on_top(self) -> bool:
        # Leaving pops the top of this thread's mode stack: not while a mode that the forward
        # entered itself is above this one (it stays on until the forward ends).
        n = torch._C._len_torch_function_stack()
        return n > 0 and torch._C._get_function_stack_at(n - 1) is self

    def _leave(self) -> None:
        # From a hook only, never from inside __torch_function__.
        if self._on:
            self._on = False
            self.__exit__(None, None, None)  # type: ignore[no-untyped-call]

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
        self._wait([i], f"read of {self._names[i]!r} before its module's forward")
