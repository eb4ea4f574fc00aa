"""Telling the other ranks why a rank failed.

When one rank dies, the others see only what the collective library saw: gloo's "Connection
closed by peer" or a time-out. So a failing rank writes its reason into the launcher's key-value
store first (``torchrun``'s store for the torch backend, ``horovodrun``'s rendezvous server for
Horovod: both live in the launcher, so they outlive the failed worker), and a rank whose
collective fails reads the others' reasons and names them in its own error.

Everything here is best effort and bounded in time: no store, an unreachable one or a dead one
only means the message says less. It never raises.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from types import TracebackType
from typing import Any, Protocol

# How long a rank whose collective failed waits for a peer's reason to appear: the peer writes
# it before its process exits, i.e. before its sockets close, so it is normally there already.
READ_WAIT_S = 2.0
_KEY = "pace/failure/{rank}"
# Error text is kept short: it travels through a store and ends up in a one-line message.
_MAX_CHARS = 500


class FailureBoard(Protocol):
    def publish(self, rank: int, message: str) -> None: ...

    def read(self, rank: int) -> str | None: ...


class TorchStoreBoard:
    """The default process group's store (``torchrun``'s, or rank 0's TCPStore)."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def publish(self, rank: int, message: str) -> None:
        self._store.set(_KEY.format(rank=rank), message[:_MAX_CHARS])

    def read(self, rank: int) -> str | None:
        key = _KEY.format(rank=rank)
        if not self._store.check([key]):
            return None
        return bytes(self._store.get(key)).decode("utf-8", "replace")


class HorovodKVBoard:
    """``horovodrun``'s rendezvous HTTP key-value server (gloo controller)."""

    _SCOPE = "pace-failures"

    def __init__(self, addr: str, port: int) -> None:
        from horovod.runner.http import http_client

        self._client = http_client
        self._addr = addr
        self._port = port

    def publish(self, rank: int, message: str) -> None:
        self._client.put_data_into_kvstore(
            self._addr, self._port, self._SCOPE, str(rank), message[:_MAX_CHARS]
        )

    def read(self, rank: int) -> str | None:
        try:
            value = self._client.read_data_from_kvstore(
                self._addr, self._port, self._SCOPE, str(rank)
            )
        except RuntimeError:  # not written (404) or no server
            return None
        return str(value)


def torch_board() -> FailureBoard | None:
    with contextlib.suppress(Exception):
        from torch.distributed import distributed_c10d

        # Reads use check() before get(), which never waits for a key.
        return TorchStoreBoard(distributed_c10d._get_default_store())
    return None


def horovod_board() -> FailureBoard | None:
    addr = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    if not addr or not port:
        return None
    with contextlib.suppress(Exception):
        return HorovodKVBoard(addr, int(port))
    return None


class Reporter:
    """One rank's view of the board: publish this rank's reason once, read the others'."""

    def __init__(self, board: FailureBoard | None, rank: int, size: int) -> None:
        self._board = board
        self.rank = rank
        self.size = size
        self._published = False
        self._lock = threading.Lock()

    def publish(self, message: str) -> None:
        """Record why this rank fails (the first reason only: later ones are consequences)."""
        with self._lock:
            if self._published or self._board is None:
                return
            self._published = True
        with contextlib.suppress(Exception):
            self._board.publish(self.rank, " ".join(message.split()))

    def peers(self, wait_s: float = READ_WAIT_S) -> dict[int, str]:
        """The reasons other ranks published, waiting up to ``wait_s`` for a first one."""
        if self._board is None:
            return {}
        deadline = time.monotonic() + wait_s
        while True:
            found: dict[int, str] = {}
            for r in range(self.size):
                if r == self.rank:
                    continue
                with contextlib.suppress(Exception):
                    text = self._board.read(r)
                    if text:
                        found[r] = text
            if found or time.monotonic() >= deadline:
                return found
            time.sleep(0.1)

    def explain(self, wait_s: float = READ_WAIT_S) -> str:
        """`` (rank 1 failed first: ValueError: ...)`` or ``""``."""
        found = self.peers(wait_s)
        if not found:
            return ""
        parts = [f"rank {r} failed: {text}" for r, text in sorted(found.items())]
        return " [" + "; ".join(parts) + "]"

    def install_excepthook(self) -> None:
        """Publish any exception that ends this rank's main thread (the user's loop included)."""
        _ACTIVE[:] = [self]
        if getattr(sys.excepthook, "_pace", False):
            return
        previous = sys.excepthook

        def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
            reporter = _ACTIVE[0] if _ACTIVE else None
            if reporter is not None and not issubclass(kind, KeyboardInterrupt):
                text = str(value)
                # Our own errors already start with "rank N:".
                own = text.startswith(f"rank {reporter.rank}:")
                reporter.publish(text if own else f"{kind.__name__}: {text}")
            previous(kind, value, tb)

        hook._pace = True  # type: ignore[attr-defined]
        sys.excepthook = hook


# The reporter of the most recent wrap() in this process, for the exception hook.
_ACTIVE: list[Reporter] = []
