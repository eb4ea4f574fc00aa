"""The forward-pass accounting of benchmarks/bench_sync_forward.py: what it reads from the
kernel per forward (each thread's CPU and run-queue wait, the host's busy time, the bytes still
in this namespace's TCP send queues) must move when the thing it names happens."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from benchmarks import bench_netns, bench_sync_forward
from benchmarks._common import host_busy_ms


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_thread_accounting_charges_the_thread_that_ran() -> None:
    me = threading.get_native_id()
    other: list[int] = []

    def work() -> None:
        other.append(threading.get_native_id())
        _spin(0.05)
        time.sleep(0.5)  # still alive when the second reading is taken

    before = bench_sync_forward._threads_ns()
    busy_before = host_busy_ms()
    t = threading.Thread(target=work)
    t.start()
    _spin(0.05)
    time.sleep(0.1)
    after = bench_sync_forward._threads_ns()
    busy_after = host_busy_ms()
    t.join()
    assert me in before
    assert me in after
    assert after[me][1] - before[me][1] >= 40e6  # its own 50 ms of CPU, in ns
    assert other[0] in after
    assert other[0] not in before
    assert after[other[0]][1] >= 40e6
    # Both spins ran on this host: its busy time grew by at least one of them (clock ticks).
    assert busy_after - busy_before >= 30.0


def test_unsent_bytes_are_those_the_peer_has_not_acknowledged() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    try:
        for s in (client, peer):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        base = bench_sync_forward._unsent_kib()
        client.setblocking(False)
        sent = 0
        # The peer never reads: once its receive window is full the rest waits in our send
        # queue, unacknowledged.
        while True:
            try:
                sent += client.send(b"x" * 65536)
            except BlockingIOError:
                break
        queued = bench_sync_forward._unsent_kib() - base
        assert queued >= 64
        assert queued <= sent / 1024 + 1
        # Once read, it is acknowledged and leaves the queue.
        while sent:
            sent -= len(peer.recv(1 << 20))
        deadline = time.monotonic() + 5
        while bench_sync_forward._unsent_kib() - base > 16 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bench_sync_forward._unsent_kib() - base <= 16
    finally:
        for s in (client, peer, server):
            s.close()


def test_a_rank_killed_by_a_signal_is_named() -> None:
    # What a Horovod re-initialisation under HOROVOD_CYCLE_TIME did to both ranks.
    procs = [subprocess.Popen([sys.executable, "-c", "import os; os.kill(os.getpid(), 11)"])]
    with pytest.raises(RuntimeError, match=r"exit codes \[-11\], killed by SIGSEGV"):
        bench_netns._wait_all(procs)
    assert "HOROVOD_CYCLE_TIME" in bench_netns.REINIT_WARNING
