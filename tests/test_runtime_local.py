"""The runtime in one process (a world of one gloo rank, or a fake backend).

Averaging over one rank is the identity, so a wrapped optimizer must reproduce the plain
optimizer bit for bit: this checks the per-parameter update path for every torch optimizer
quickly, without launching processes. Misuse, time-outs and shutdown are checked here too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import pace.runtime  # noqa: E402
from pace.errors import InputError, RuntimeReplayError, ScheduleMismatchError  # noqa: E402
from pace.io import save_schedule  # noqa: E402
from pace.ir import CommModel, Schedule, Slice, Unit  # noqa: E402
from pace.runtime import optimizer as runtime_optimizer  # noqa: E402
from pace.runtime.backends import CollectiveTimeoutError  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module", autouse=True)
def one_rank_group() -> Iterator[None]:
    torch.set_num_threads(1)
    if dist.is_initialized():  # another test's group in this process: usable only if 1 rank
        if dist.get_world_size() != 1:
            pytest.skip("torch.distributed already initialised with several ranks")
        yield
        return
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def no_threads_left() -> Iterator[None]:
    yield
    left = [t.name for t in threading.enumerate() if t.name.startswith("pace-")]
    assert left == [], f"runtime threads left behind: {left}"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 3)

    def forward(self, x: Any) -> Any:
        return self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


def net() -> Net:
    torch.manual_seed(3)
    return Net()


def schedule_for(model: nn.Module) -> Schedule:
    """Partition fc2.weight in three, fuse the rest in two groups; out of backward order."""
    size = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
    w = size["fc2.weight"]
    return Schedule(
        trace_digest="sha256:t",
        cost_model=CommModel(workers=1, alpha_us=1.0, beta_us_per_byte=0.0),
        units=(
            Unit(
                priority=0,
                slices=(
                    Slice(tensor="fc3.weight", offset_bytes=0, size_bytes=size["fc3.weight"]),
                    Slice(tensor="fc3.bias", offset_bytes=0, size_bytes=size["fc3.bias"]),
                ),
            ),
            Unit(
                priority=1, slices=(Slice(tensor="fc2.weight", offset_bytes=0, size_bytes=w // 4),)
            ),
            Unit(
                priority=2,
                slices=(Slice(tensor="fc2.weight", offset_bytes=w // 4, size_bytes=w // 2),),
            ),
            Unit(
                priority=3,
                slices=(
                    Slice(tensor="fc2.weight", offset_bytes=3 * w // 4, size_bytes=w // 4),
                    Slice(tensor="fc2.bias", offset_bytes=0, size_bytes=size["fc2.bias"]),
                    Slice(tensor="fc1.bias", offset_bytes=0, size_bytes=size["fc1.bias"]),
                ),
            ),
            Unit(
                priority=4,
                slices=(Slice(tensor="fc1.weight", offset_bytes=0, size_bytes=size["fc1.weight"]),),
            ),
        ),
        predicted_iteration_us=0.0,
    )


def _grad(p: Any) -> Any:
    assert p.grad is not None
    return p.grad


def train(model: nn.Module, opt: Any, steps: int = 12, *, sched: bool = True) -> None:
    lr_sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7) if sched else None
    g = torch.Generator().manual_seed(11)
    for _ in range(steps):
        x, y = torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if lr_sched is not None:
            lr_sched.step()


def _two_groups(params: list[Any]) -> Any:
    # Two param groups with different hyper-parameters.
    return torch.optim.SGD(
        [{"params": params[:2], "lr": 0.2}, {"params": params[2:]}], lr=0.05, momentum=0.5
    )


OPTIMIZERS: dict[str, Callable[[Any], Any]] = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.05),
    "adadelta": lambda p: torch.optim.Adadelta(p, lr=1.0),
    "adamax": lambda p: torch.optim.Adamax(p, lr=0.01),
    "nadam": lambda p: torch.optim.NAdam(p, lr=0.01),
    "radam": lambda p: torch.optim.RAdam(p, lr=0.01),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.01, centered=True),
    "rprop": lambda p: torch.optim.Rprop(p, lr=0.01),
    "asgd": lambda p: torch.optim.ASGD(p, lr=0.01),
    # Two param groups with different hyper-parameters.
    "sgd-groups": lambda p: _two_groups(list(p)),
}


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("mode", ["schedule", "online"])
def test_any_optimizer_is_bitwise_the_plain_optimizer(kind: str, mode: str) -> None:
    ref = net()
    train(ref, OPTIMIZERS[kind](ref.parameters()))
    model = net()
    schedule = schedule_for(model) if mode == "schedule" else None
    opt = pace.runtime.wrap(
        OPTIMIZERS[kind](model.parameters()),
        model,
        schedule,
        backend="torch",
        partition_bytes=256,
        credit_bytes=600,
        timeout_s=30.0,
    )
    assert isinstance(opt, torch.optim.Optimizer)
    train(model, opt)
    opt.synchronize()
    for (name, a), b in zip(ref.named_parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(ref.fc1.weight, net().fc1.weight)  # it did train
    # Same optimizer state too (e.g. Adam's step counters and moments).
    sd = opt.state_dict()
    assert len(sd["state"]) == len(list(model.parameters()))
    opt.close()


def test_random_delays_in_hooks_dispatch_and_completion_change_nothing() -> None:
    ref = net()
    train(ref, OPTIMIZERS["adam"](ref.parameters()))
    model = net()
    opt = pace.runtime.wrap(
        OPTIMIZERS["adam"](model.parameters()),
        model,
        schedule_for(model),
        backend="torch",
        inject_delay_s=0.003,
        seed=5,
        credit_bytes=64,
    )
    train(model, opt)
    opt.synchronize()  # type: ignore[attr-defined]
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), model.parameters(), strict=True))
    opt.close()  # type: ignore[attr-defined]


def test_step_returns_before_updates_and_forward_waits_for_them() -> None:
    model = net()
    opt = pace.runtime.wrap(
        torch.optim.SGD(model.parameters(), lr=0.1),
        model,
        schedule_for(model),
        backend="torch",
        inject_delay_s=0.02,  # slow completions: updates are still in flight after step()
    )
    x = torch.randn(4, 6)
    # Taken before backward: an update may run as soon as its gradient is reduced.
    before = model.fc1.weight.detach().clone()
    model(x).sum().backward()
    opt.step()
    expected = before.add(_grad(model.fc1.weight), alpha=-0.1)  # SGD's own arithmetic
    model(x)  # fc1's forward pre-hook waits for fc1's update
    assert torch.equal(model.fc1.weight.detach(), expected)
    opt.zero_grad()
    opt.close()  # type: ignore[attr-defined]


def test_state_dict_of_the_model_waits_for_updates() -> None:
    model = net()
    opt = pace.runtime.wrap(
        torch.optim.SGD(model.parameters(), lr=0.1),
        model,
        schedule_for(model),
        backend="torch",
        inject_delay_s=0.01,
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    expected = {n: before[n].add(_grad(p), alpha=-0.1) for n, p in model.named_parameters()}
    sd = model.state_dict()
    assert all(torch.equal(sd[n], v) for n, v in expected.items())
    opt.close()  # type: ignore[attr-defined]


def test_misuse_is_reported_not_silently_wrong() -> None:
    model = net()
    opt = pace.runtime.wrap(
        torch.optim.SGD(model.parameters(), lr=0.1), model, schedule_for(model), backend="torch"
    )
    x = torch.randn(4, 6)
    model(x).sum().backward()
    with pytest.raises(RuntimeReplayError, match="zero_grad"):
        opt.zero_grad()
    with pytest.raises(RuntimeReplayError, match="between backward"):
        opt.synchronize()  # type: ignore[attr-defined]
    with pytest.raises(RuntimeReplayError, match="forward of 'fc1' between backward"):
        model(x)  # gradient accumulation: fc1 may already be updated in place
    opt.close()  # type: ignore[attr-defined]
    model = net()
    opt = pace.runtime.wrap(
        torch.optim.SGD(model.parameters(), lr=0.1), model, schedule_for(model), backend="torch"
    )
    loss = model(x).sum()
    loss.backward(retain_graph=True)
    # Either our hook sees the second gradient, or autograd sees that a parameter it saved was
    # already updated in place: loud either way.
    with pytest.raises(
        (RuntimeReplayError, RuntimeError), match=r"computed twice|modified by an inplace"
    ):
        loss.backward()
    opt.close()  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="closure"):
        opt.step(lambda: 0.0)


class ReadsAhead(nn.Module):
    """The parent reads its child's bias (and a list with the child's weight) before the
    child's forward runs: reads the child's pre-hook does not cover."""

    def __init__(self, own_mode: bool) -> None:
        super().__init__()
        self.a = nn.Linear(6, 16)
        self.b = nn.Linear(16, 3)
        self.own_mode = own_mode

    def forward(self, x: Any) -> Any:
        # The model's own torch function mode around its body: the guard must not pop it.
        with _Passthrough() if self.own_mode else contextlib.nullcontext():
            h = torch.tanh(self.a(x))
            h = h[:, :3] + self.b.bias
            w = torch.cat([self.b.weight, self.b.weight])  # a TensorList argument
            return self.b(torch.tanh(h @ w[:3, :3]).repeat(1, 6)[:, :16])


class _Passthrough(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def test_read_guard_is_on_only_while_updates_are_in_flight_and_pops_only_itself() -> None:
    from pace.runtime.reads import ReadGuard

    p, q = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
    in_flight = [True]
    waits: list[tuple[list[int], str]] = []
    guard = ReadGuard(
        [p, q], ["p", "q"], lambda i, what: waits.append((list(i), what)), lambda: in_flight[0]
    )

    def depth() -> int:
        return int(torch._C._len_torch_function_stack())

    guard.begin()
    assert depth() == 1
    _ = p + 1  # the first read of p waits
    _ = torch.cat([p, p])  # not again
    assert waits == [([0], "read of 'p' while its update was in flight")]
    with _Passthrough() as own:
        in_flight[0] = False
        guard.waited([1])  # nothing in flight, but the forward's own mode is on top: stays
        assert depth() == 2
        assert torch._C._get_function_stack_at(1) is own
    assert torch._C._get_function_stack_at(0) is guard
    guard.end()
    assert depth() == 0
    guard.begin()  # nothing in flight at the start: not entered
    assert depth() == 0
    _ = q + 1
    guard.end()
    in_flight[0] = True
    guard.begin()
    in_flight[0] = False
    guard.waited([0])  # the last update landed: the guard leaves at once
    assert depth() == 0
    _ = q + 1
    guard.end()
    assert depth() == 0
    assert len(waits) == 1


def test_read_guard_after_step_stays_on_until_the_forward_and_never_pops_a_users_mode() -> None:
    from pace.runtime.reads import ReadGuard

    p, q = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
    in_flight = [True]
    waits: list[list[int]] = []
    guard = ReadGuard(
        [p, q], ["p", "q"], lambda i, _what: waits.append(list(i)), lambda: in_flight[0]
    )

    def depth() -> int:
        return int(torch._C._len_torch_function_stack())

    guard.after_step()  # updates in flight after step(): on
    assert depth() == 1
    _ = p.detach()  # an EMA's read waits for p
    with _Passthrough() as own:  # a mode the user enters after step() sits above the guard
        _ = q.data  # a read through .data waits for q
        assert torch._C._get_function_stack_at(1) is own
    assert waits == [[0], [1]]
    guard.begin()  # the forward starts with updates still in flight: stays on, nothing new
    _ = p + q
    assert waits == [[0], [1]]
    guard.end()
    assert depth() == 0
    # A user's mode around step(): not entered above it (its exit would pop the guard); every
    # update is waited for instead.
    with _Passthrough() as own:
        guard.after_step()
        assert depth() == 1
        assert torch._C._get_function_stack_at(0) is own
    assert waits[-1] == [0, 1]
    assert guard.waited_at_step == 1
    # On since step(), then a forward starting with nothing in flight: leaves at once.
    guard.after_step()
    in_flight[0] = False
    guard.begin()
    assert depth() == 0
    guard.end()
    # Not from another thread's stack: release() there leaves it on; the owner's leaves.
    in_flight[0] = True
    guard.after_step()
    other = threading.Thread(target=guard.release)
    other.start()
    other.join()
    assert depth() == 1
    guard.release()
    assert depth() == 0
    # Nothing in flight at step(): never entered.
    in_flight[0] = False
    guard.after_step()
    assert depth() == 0


@pytest.mark.parametrize("around_step", [False, True])
@pytest.mark.parametrize("delay_s", [0.0, 0.002])
def test_reads_after_step_wait_for_their_updates(delay_s: float, around_step: bool) -> None:
    """An EMA of the weights and a copy of them right after step(), while the updates are in
    flight: bitwise the plain optimizer's (without the guard after step() both differ,
    silently). ``around_step``: a torch function mode of the user's is on around step()."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    def trained(wrap: bool) -> list[Any]:
        torch.manual_seed(0)
        model = net()
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        opt: Any = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        if wrap:
            opt = pace.runtime.wrap(opt, model, schedule_for(model), inject_delay_s=delay_s)
        copies = []
        g = torch.Generator().manual_seed(11)
        for _ in range(8):
            x, y = torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            with _Passthrough() if around_step else contextlib.nullcontext():
                opt.step()
            ema.update_parameters(model)
            copies += [p.data.clone() for p in model.parameters()]
        if wrap:
            assert opt._pace_guard.waited_at_step == (8 if around_step else 0)
            opt.synchronize()
            opt.close()
        assert torch._C._len_torch_function_stack() == 0  # the guard left no mode behind
        return copies + [p.detach().clone() for p in ema.module.parameters()]

    for a, b in zip(trained(False), trained(True), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("own_mode", [False, True])
@pytest.mark.parametrize("delay_s", [0.0, 0.002])
def test_a_parameter_read_before_its_modules_forward_waits_for_its_update(
    delay_s: float, own_mode: bool
) -> None:
    """Bitwise the plain optimizer although updates are in flight when the parent reads the
    child's parameters (without pace.runtime.reads the result differs, silently)."""

    def trained(wrap: bool) -> list[Any]:
        torch.manual_seed(0)
        model = ReadsAhead(own_mode)
        opt: Any = torch.optim.SGD(model.parameters(), lr=0.5)
        if wrap:
            sched = dataclasses.replace(
                schedule_for(net()),
                units=tuple(
                    Unit(
                        priority=k,
                        slices=(Slice(tensor=n, offset_bytes=0, size_bytes=4 * p.numel()),),
                    )
                    for k, (n, p) in enumerate(model.named_parameters())
                ),
            )
            opt = pace.runtime.wrap(opt, model, sched, inject_delay_s=delay_s)
        train(model, opt, steps=10, sched=False)
        if wrap:
            opt.synchronize()
            opt.close()
        assert torch._C._len_torch_function_stack() == 0  # the guard left no mode behind
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(trained(False), trained(True), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", ["overlap", "sync"])
def test_a_forward_on_a_side_cuda_stream_is_refused(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """docs/gpu.md: the runtime is ordered with the default CUDA stream only. The stream check
    is stood in for (no GPU here); tests/test_gpu.py runs the real one. A forward without
    gradients stays allowed in the sync mode, where the user's own step updates."""
    model = net()
    sched = dataclasses.replace(schedule_for(model), mode=mode)
    opt = pace.runtime.wrap(
        torch.optim.SGD(model.parameters(), lr=0.1), model, sched, sync=mode == "sync"
    )
    x = torch.randn(4, 6)
    train(model, opt, steps=2, sched=False)  # on the default stream: trains
    monkeypatch.setattr(runtime_optimizer, "_on_default_stream", lambda _device: False)
    with pytest.raises(RuntimeReplayError, match=r"rank 0: .*non-default CUDA stream"):
        model(x)
    if mode == "sync":
        with torch.no_grad():
            model(x)
    else:
        with pytest.raises(RuntimeReplayError, match="non-default CUDA stream"), torch.no_grad():
            model(x)
    opt.close()  # type: ignore[attr-defined]


def test_unused_parameter_is_left_alone_like_ddp_find_unused_parameters() -> None:
    """torch backend = DDP(find_unused_parameters=True): a parameter no rank used keeps
    ``.grad`` None and the optimizer skips it (weight decay does not move it)."""
    model = net()
    opt = pace.runtime.wrap(
        torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.5),
        model,
        schedule_for(model),
        backend="torch",
    )
    before = model.fc3.weight.detach().clone()
    opt.step()  # no backward at all: no parameter was used
    opt.synchronize()  # type: ignore[attr-defined]
    assert model.fc3.weight.grad is None
    assert torch.equal(model.fc3.weight.detach(), before)
    # Used in the next iteration: reduced and updated as usual.
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    opt.synchronize()  # type: ignore[attr-defined]
    assert model.fc3.weight.grad is not None
    assert not torch.equal(model.fc3.weight.detach(), before)
    opt.close()  # type: ignore[attr-defined]


def test_lbfgs_and_double_wrap_are_refused() -> None:
    model = net()
    with pytest.raises(InputError, match="LBFGS"):
        pace.runtime.wrap(torch.optim.LBFGS(model.parameters()), model, None, backend="torch")
    with pytest.raises(InputError, match="credit_bytes"):
        pace.runtime.wrap(
            torch.optim.SGD(model.parameters(), lr=0.1),
            model,
            None,
            backend="torch",
            credit_bytes=0,
        )


@pytest.mark.horovod
def test_a_gradient_dtype_horovod_cannot_reduce_is_refused_at_wrap() -> None:
    """Horovod 0.28 reduces no bfloat16 tensor on the CPU (its own optimizer raises at the first
    backward): wrap refuses such a model before training, naming the parameter and the way out."""
    pytest.importorskip("horovod.torch")
    from pace.runtime.backends import horovod_unreducible

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).half(), nn.Linear(4, 2))
    assert horovod_unreducible(list(model.named_parameters())) == []
    model[2].to(torch.bfloat16)
    assert horovod_unreducible(list(model.named_parameters())) == [
        ("2.weight", "torch.BFloat16Tensor"),
        ("2.bias", "torch.BFloat16Tensor"),
    ]
    for schedule in (None, "no-such-schedule.json"):
        with pytest.raises(InputError) as info:
            pace.runtime.wrap(
                torch.optim.SGD(model.parameters(), lr=0.1), model, schedule, fallback=True
            )
        err = info.value
        assert err.where == "backend"
        assert "cannot all-reduce torch.BFloat16Tensor" in err.detail
        assert "'2.weight', '2.bias'" in err.detail
        assert "backend='torch'" in err.detail


def test_mismatched_schedule_file_is_refused_at_start(tmp_path: Path) -> None:
    other = nn.Sequential(nn.Linear(6, 16), nn.Linear(16, 3))
    path = tmp_path / "other.schedule.json"
    save_schedule(
        Schedule(
            trace_digest="sha256:o",
            cost_model=CommModel(workers=2, alpha_us=1.0, beta_us_per_byte=0.0),
            units=tuple(
                Unit(
                    priority=i, slices=(Slice(tensor=n, offset_bytes=0, size_bytes=p.numel() * 4),)
                )
                for i, (n, p) in enumerate(other.named_parameters())
            ),
            predicted_iteration_us=0.0,
        ),
        path,
    )
    model = net()
    with pytest.raises(
        ScheduleMismatchError, match=rf"{path.name}: units: schedule does not belong"
    ):
        pace.runtime.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, path, backend="torch")
    assert not [t for t in threading.enumerate() if t.name.startswith("pace-")]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"format": "pace.schedule", "version": 1, "units": [', "JSON|json"),
        (b'{"format": "pace.schedule", "version": 7}', "version"),
        (b"\x1f\x8b\x08garbage", None),
    ],
)
def test_corrupted_schedule_file_is_refused_at_start(
    tmp_path: Path, content: bytes, message: str | None
) -> None:
    path = tmp_path / "bad.schedule.json"
    path.write_bytes(content)
    model = net()
    with pytest.raises(InputError, match=message) as info:
        pace.runtime.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, path, backend="torch")
    assert "bad.schedule.json" in str(info.value)


def test_truncated_gzip_schedule_is_refused(tmp_path: Path) -> None:
    model = net()
    good = tmp_path / "good.schedule.json.gz"
    save_schedule(schedule_for(model), good)
    bad = tmp_path / "bad.schedule.json.gz"
    bad.write_bytes(good.read_bytes()[:-20])
    with pytest.raises(InputError, match=r"bad\.schedule\.json\.gz"):
        pace.runtime.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, bad, backend="torch")
    # The intact file is accepted.
    assert gzip.decompress(good.read_bytes())
    opt = pace.runtime.wrap(
        torch.optim.SGD(model.parameters(), lr=0.1), model, good, backend="torch"
    )
    opt.close()  # type: ignore[attr-defined]


def test_fallback_warns_exactly_once_and_trains_plainly() -> None:
    ref = net()
    train(ref, OPTIMIZERS["sgd"](ref.parameters()))
    model = net()
    broken = Schedule(
        trace_digest="sha256:t",
        cost_model=CommModel(workers=1, alpha_us=1.0, beta_us_per_byte=0.0),
        units=schedule_for(model).units[1:],  # fc3.* uncovered
        predicted_iteration_us=0.0,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = pace.runtime.wrap(
            OPTIMIZERS["sgd"](model.parameters()), model, broken, backend="torch", fallback=True
        )
        train(model, opt)
        opt.synchronize()  # type: ignore[attr-defined]
    assert len(caught) == 1
    assert "falling back" in str(caught[0].message)
    assert "fc3" in str(caught[0].message)
    assert opt.pace_plan.source == "wfbp"  # type: ignore[attr-defined]
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), model.parameters(), strict=True))
    opt.close()  # type: ignore[attr-defined]


def _framework_file(tmp_path: Path, schedule: Schedule) -> Path:
    """``schedule`` marked to train with Horovod's own path, as ``pace compile`` writes it."""
    path = tmp_path / "framework.schedule.json"
    save_schedule(dataclasses.replace(schedule, framework="horovod"), path)
    return path


@pytest.mark.parametrize("fallback", [False, True])
def test_framework_schedule_is_refused_on_another_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fallback: bool
) -> None:
    """Horovod's path chosen by the compiler, wrapped with backend="torch": refused from the
    arguments alone (so on every rank), never a reason to fall back; Horovod is not touched."""
    monkeypatch.setattr(runtime_optimizer, "import_horovod", _no_horovod)
    model = net()
    path = _framework_file(tmp_path, schedule_for(model))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ScheduleMismatchError) as info:
            pace.runtime.wrap(
                torch.optim.SGD(model.parameters(), lr=0.1),
                model,
                path,
                backend="torch",
                fallback=fallback,
            )
    err = info.value
    assert (err.where, err.field) == (str(path), "framework")
    assert "Horovod's own data-parallel path" in err.detail
    assert "backend='horovod'" in err.detail
    assert "pace compile --no-framework" in err.detail
    assert caught == []


def _no_horovod() -> Any:
    raise AssertionError("Horovod touched before the schedule was refused")


def test_framework_schedule_refuses_drift_and_another_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime_optimizer, "import_horovod", _no_horovod)
    model = net()
    path = _framework_file(tmp_path, schedule_for(model))
    with pytest.raises(InputError) as info:
        pace.runtime.wrap(
            torch.optim.SGD(model.parameters(), lr=0.1), model, path, backend="horovod", drift=True
        )
    assert info.value.where == "drift"
    assert "trains with Horovod's own data-parallel path" in info.value.detail
    assert "pace compile --no-framework" in info.value.detail
    # The units are still checked against the model: a schedule of another model is an error.
    other = schedule_for(model)
    other = dataclasses.replace(other, units=other.units[1:])  # fc3.* uncovered
    with pytest.raises(ScheduleMismatchError, match="schedule does not belong"):
        pace.runtime.wrap(
            torch.optim.SGD(model.parameters(), lr=0.1),
            model,
            _framework_file(tmp_path, other),
            backend="horovod",
        )


class _StuckBackend:
    """A peer that never shows up: every collective times out."""

    name = "stuck"
    rank = 3
    size = 2
    in_order = False
    pre_scale = 0.5
    sum_scale = 1.0

    def start(self, buf: Any, name: str) -> Any:
        return name

    def wait(self, handle: Any, timeout_s: float) -> None:
        time.sleep(timeout_s)
        raise CollectiveTimeoutError(f"not finished after {timeout_s:g} s")

    def broadcast_from_rank0(self, tensors: Any, name: str) -> None:
        """One rank: every rank already holds rank 0's values."""

    def close(self) -> None:
        pass


def test_a_stuck_collective_times_out_naming_unit_and_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_optimizer, "make_backend", lambda _name: _StuckBackend())
    model = net()
    opt = pace.runtime.wrap(
        torch.optim.SGD(model.parameters(), lr=0.1),
        model,
        schedule_for(model),
        backend="torch",
        timeout_s=0.3,
    )
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    with pytest.raises(
        RuntimeReplayError,
        match=r"rank 3: unit 0 \(fc3\.weight, fc3\.bias\) of iteration 0 did not complete",
    ):
        model(torch.randn(4, 6))  # waits for fc1's update, which never comes
    with pytest.raises(RuntimeReplayError):
        opt.step()  # the failure stays visible
    opt.close()  # type: ignore[attr-defined]


def test_close_is_idempotent_and_threads_stop() -> None:
    model = net()
    opt = pace.runtime.wrap(
        torch.optim.SGD(model.parameters(), lr=0.1), model, None, backend="torch"
    )
    assert {t.name for t in threading.enumerate()} >= {"pace-dispatch", "pace-complete"}
    opt.close()  # type: ignore[attr-defined]
    opt.close()  # type: ignore[attr-defined]


class _RecordingMonitor:
    def __init__(self) -> None:
        self.ready: list[int] = []
        self.units: list[tuple[int, int, float]] = []

    def on_grad_ready(self, index: int, t_us: float) -> None:
        self.ready.append(index)

    def on_unit_done(self, unit: int, nbytes: int, channel_us: float) -> None:
        self.units.append((unit, nbytes, channel_us))


def test_schedule_switch_at_a_boundary_and_monitor_events() -> None:
    ref = net()
    train(ref, OPTIMIZERS["adam"](ref.parameters()))
    model = net()
    monitor = _RecordingMonitor()
    opt = pace.runtime.wrap(
        OPTIMIZERS["adam"](model.parameters()),
        model,
        schedule_for(model),
        backend="torch",
        monitor=monitor,
        inject_delay_s=0.002,
    )
    names = opt.pace_param_names  # type: ignore[attr-defined]
    per_tensor = Schedule(
        trace_digest="sha256:t2",
        cost_model=CommModel(workers=1, alpha_us=1.0, beta_us_per_byte=0.0),
        units=tuple(
            Unit(priority=k, slices=(Slice(tensor=n, offset_bytes=0, size_bytes=p.numel() * 4),))
            for k, (n, p) in enumerate(model.named_parameters())
        ),
        predicted_iteration_us=0.0,
    )
    switched_at = []

    def train_switching() -> None:
        lr_sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
        g = torch.Generator().manual_seed(11)
        for step in range(12):
            x, y = torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            if step == 4:
                with pytest.raises(RuntimeReplayError, match="between step"):
                    opt.switch_schedule(per_tensor)  # type: ignore[attr-defined]
            opt.step()
            lr_sched.step()
            if step in (4, 8):
                sched = per_tensor if step == 4 else schedule_for(model)
                switched_at.append(opt.switch_schedule(sched))  # type: ignore[attr-defined]

    train_switching()
    opt.synchronize()  # type: ignore[attr-defined]
    assert switched_at == [5, 9]
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), model.parameters(), strict=True))
    assert names == tuple(n for n, _ in model.named_parameters())
    assert len(monitor.ready) == 12 * len(names)
    # Iterations 0-4 and 9-11 replay the 5-unit schedule, 5-8 the 6-unit one.
    assert len(monitor.units) == 5 * 5 + 4 * 6 + 3 * 5
    assert all(us >= 0 for _, _, us in monitor.units)
    renamed = Schedule(
        trace_digest="sha256:t3",
        cost_model=per_tensor.cost_model,
        units=(
            *per_tensor.units[1:],
            Unit(priority=9, slices=(Slice(tensor="x", offset_bytes=0, size_bytes=4),)),
        ),
        predicted_iteration_us=0.0,
    )
    with pytest.raises(ScheduleMismatchError):
        opt.switch_schedule(renamed)  # type: ignore[attr-defined]
    assert opt.pace_plan.units[0].pieces[0].param == 4  # type: ignore[attr-defined]
    opt.close()  # type: ignore[attr-defined]


class _CountingBackend:
    """One rank; records how many collectives are in flight at once (started, not waited)."""

    name = "counting"
    rank = 0
    size = 1
    pre_scale = 1.0
    sum_scale = 1.0

    def __init__(self, in_order: bool) -> None:
        self.in_order = in_order
        self.in_flight = 0
        self.most = 0
        self._lock = threading.Lock()

    def start(self, buf: Any, name: str) -> Any:
        with self._lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        return name

    def wait(self, handle: Any, timeout_s: float) -> None:
        time.sleep(0.01)  # a collective that takes a while: room for others to start
        with self._lock:
            self.in_flight -= 1

    def broadcast_from_rank0(self, tensors: Any, name: str) -> None:
        """One rank: every rank already holds rank 0's values."""

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("schedule", "in_order", "knobs", "most"),
    [
        # A replay on a backend that may run collectives side by side: one unit at a time,
        # the schedule's contract (one channel).
        (True, False, {}, 1),
        # An in-order backend queues them itself: every ready unit is issued at once.
        (True, True, {}, 2),
        (True, True, {"credit_bytes": 1}, 1),  # an explicit window wins
        (True, False, {"credit_bytes": 1 << 30}, 2),  # a window is still available on request
        (False, False, {}, 2),  # online: ByteScheduler's credit window
    ],
)
def test_replay_window_follows_the_backend_unless_given(
    monkeypatch: pytest.MonkeyPatch,
    schedule: bool,
    in_order: bool,
    knobs: dict[str, Any],
    most: int,
) -> None:
    backend = _CountingBackend(in_order)
    monkeypatch.setattr(runtime_optimizer, "make_backend", lambda _name: backend)
    model = net()
    opt = pace.runtime.wrap(
        torch.optim.SGD(model.parameters(), lr=0.1),
        model,
        schedule_for(model) if schedule else None,
        backend="torch",
        partition_bytes=64,  # online: many small pieces
        **knobs,
    )
    train(model, opt, steps=3)
    opt.synchronize()  # type: ignore[attr-defined]
    opt.close()  # type: ignore[attr-defined]
    assert backend.most == most if most == 1 else backend.most >= most
