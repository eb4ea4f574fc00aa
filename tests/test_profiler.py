"""Profiler on real (tiny) torch models: structure of the trace, verify, Kineto cross-check."""

from __future__ import annotations

import collections
import dataclasses
import statistics

import pytest

pytest.importorskip("torch")
import torch
from torch import nn

from pace.errors import InputError
from pace.ir import FusionPlan, Trace
from pace.profiler import profile
from pace.profiler.workloads import Seq2Seq, TinyGPT, build_workload
from pace.verify import verify_schedule, verify_trace

pytestmark = pytest.mark.torch


class SmallCNN(nn.Module):
    """conv-bn-relu twice, a residual add, a classifier; one frozen and one unused parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)
        self.unused = nn.Linear(2, 2)
        self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        h = h + torch.relu(self.bn2(self.conv2(h)))
        out: torch.Tensor = self.fc(h.mean(dim=(2, 3)))
        return out


def _cnn_trace(**kw: object) -> tuple[SmallCNN, Trace]:
    torch.manual_seed(0)
    model = SmallCNN()
    x = torch.randn(2, 3, 8, 8)
    y = torch.tensor([1, 3])

    def step(m: nn.Module) -> torch.Tensor:
        return nn.functional.cross_entropy(m(x), y)

    opts: dict[str, object] = {"iters": 2, "warmup": 1}
    opts.update(kw)
    return model, profile(model, step, **opts)  # type: ignore[arg-type]


def _module_of(op_name: str) -> str:
    # fw.0003.layer1.0.conv1.convolution -> layer1.0.conv1
    return op_name.split(".", 2)[2].rsplit(".", 1)[0]


def _kind_of(op_name: str) -> str:
    return op_name.rsplit(".", 1)[1]


def test_every_parameter_with_a_gradient_is_one_tensor_with_its_size() -> None:
    model, trace = _cnn_trace()
    expected = {
        n: p.numel() * p.element_size()
        for n, p in model.named_parameters()
        if p.requires_grad and p.grad is not None
    }
    names = [t.name for t in trace.tensors]
    assert len(names) == len(set(names))
    assert {t.name: t.size_bytes for t in trace.tensors} == expected
    assert "unused.weight" not in names
    assert "frozen" not in names
    assert set(trace.meta["parameters_without_grad"]) == {"unused.weight", "unused.bias"}


def test_trace_verifies_and_has_window_shape() -> None:
    _, trace = _cnn_trace()
    verify_trace(trace)
    phases = [op.phase for op in trace.ops]
    # The window: the whole backward pass of iteration k, then the forward pass of k+1.
    n_bw = phases.count("backward")
    assert phases == ["backward"] * n_bw + ["forward"] * (len(phases) - n_bw)
    assert n_bw > 0
    assert n_bw < len(phases)
    # One compute stream: each op depends on the op that ran before it.
    for prev, op in zip(trace.ops, trace.ops[1:], strict=False):
        assert prev.name in op.deps
    ops = trace.op_map()
    for t in trace.tensors:
        assert ops[t.producer].phase == "backward"
        assert all(ops[c].phase == "forward" for c in t.consumers)


def test_consumers_are_the_forward_ops_that_read_the_parameter() -> None:
    _, trace = _cnn_trace()
    by_name = trace.tensor_map()
    for t in trace.tensors:
        module = t.name.rsplit(".", 1)[0]
        assert t.consumers, t.name
        # Each parameter here is read by exactly one op of its own module.
        assert [_module_of(c) for c in t.consumers] == [module], (t.name, t.consumers)
    # Linear reads its weight through a view (t): the addmm still consumes it.
    assert [_kind_of(c) for c in by_name["fc.weight"].consumers] == ["addmm"]
    assert [_kind_of(c) for c in by_name["conv1.weight"].consumers] == ["convolution"]


def test_producers_and_shared_producer_of_one_backward_op() -> None:
    _, trace = _cnn_trace()
    by_name = trace.tensor_map()
    # One backward op makes several gradients: they share it as producer.
    assert by_name["conv1.weight"].producer == by_name["conv1.bias"].producer
    assert by_name["bn1.weight"].producer == by_name["bn1.bias"].producer
    assert _kind_of(by_name["conv1.weight"].producer) == "ConvolutionBackward0"
    assert _module_of(by_name["conv1.weight"].producer) == "conv1"
    # The weight's gradient comes out of TBackward0 (folded): produced by the AddmmBackward0.
    assert _kind_of(by_name["fc.weight"].producer) == "AddmmBackward0"
    # Tensors are listed in ready order: the classifier's gradient is ready first.
    order = [t.name for t in trace.tensors]
    assert order.index("fc.weight") < order.index("conv1.weight")


def test_zero_cost_and_buffer_only_ops_are_folded() -> None:
    _, trace = _cnn_trace()
    kinds = {_kind_of(op.name) for op in trace.ops}
    assert not kinds & {"t", "view", "detach", "expand", "empty", "TBackward0"}
    # BatchNorm's num_batches_tracked += 1 touches a buffer only.
    assert not any(_kind_of(op.name) == "add_" and "bn" in op.name for op in trace.ops)
    assert trace.meta["raw_forward_ops"] > trace.meta["forward_ops"]


def test_structure_is_deterministic() -> None:
    _, a = _cnn_trace()
    _, b = _cnn_trace()
    assert [(o.name, o.deps) for o in a.ops] == [(o.name, o.deps) for o in b.ops]
    assert [(t.name, t.producer, t.consumers) for t in a.tensors] == [
        (t.name, t.producer, t.consumers) for t in b.tensors
    ]


def test_data_dependencies_without_order_edges() -> None:
    _, trace = _cnn_trace(order_edges=False)
    verify_trace(trace)
    ops = trace.op_map()
    # The residual add reads the first block's relu and the second block's relu.
    add = next(o for o in trace.ops if o.phase == "forward" and _kind_of(o.name) == "add")
    assert sorted(_kind_of(d) for d in add.deps) == ["relu", "relu"]
    first_fw = next(o for o in trace.ops if o.phase == "forward")
    assert first_fw.deps == ()
    assert all(ops[d].phase == "forward" for o in trace.ops if o.phase == "forward" for d in o.deps)


def test_tied_weights_are_one_tensor_with_several_consumers() -> None:
    torch.manual_seed(0)
    model = TinyGPT(vocab=50, d_model=16, n_layers=1, n_heads=2)
    tokens = torch.randint(0, 50, (2, 9))

    def step(m: nn.Module) -> torch.Tensor:
        logits = m(tokens[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, 50), tokens[:, 1:].reshape(-1))

    trace = profile(model, step, iters=2, warmup=1)
    verify_trace(trace)
    tok = trace.tensor_map()["tok.weight"]
    assert tok.size_bytes == 50 * 16 * 4
    # Read by the embedding and by the output head (the same Parameter object).
    assert sorted(_kind_of(c) for c in tok.consumers) == ["embedding", "mm"]
    assert "head.weight" not in trace.tensor_map()  # named_parameters() dedups tied weights
    # Ready after both backward paths: the embedding's backward runs last.
    assert _kind_of(tok.producer) == "EmbeddingBackward0"


def test_builtin_transformer_has_at_least_100_tensors() -> None:
    model = build_workload("pace:transformer", batch_size=1).model
    assert len(list(model.parameters())) >= 100


def test_vgg_cifar_profiles_with_the_late_layers_holding_most_bytes() -> None:
    w = build_workload("pace:vgg-cifar", batch_size=1, num_classes=10)
    trace = profile(w.model, w.step_fn, iters=1, warmup=1)
    verify_trace(trace)
    assert {t.name for t in trace.tensors} == {n for n, _ in w.model.named_parameters()}
    sizes = [t.size_bytes for t in trace.tensors]
    assert len(sizes) == 28  # 13 convolutions + 1 linear, weight and bias each
    assert sum(sizes) == 14_719_818 * 4
    # The property the throttled-link benchmark relies on: the last six convolutions (512
    # channels) hold most of the gradient bytes, and their gradients are produced first.
    late = sum(t.size_bytes for t in trace.tensors if t.size_bytes >= 512 * 512 * 9 * 4)
    assert late > 0.5 * sum(sizes)


def test_lstm_seq2seq_profiles() -> None:
    torch.manual_seed(0)
    model = Seq2Seq(vocab=40, d_model=8, n_layers=2)
    src = torch.randint(0, 40, (2, 4))
    tgt = torch.randint(0, 40, (2, 5))

    def step(m: nn.Module) -> torch.Tensor:
        out = m(src, tgt[:, :-1])
        return nn.functional.cross_entropy(out.reshape(-1, 40), tgt[:, 1:].reshape(-1))

    trace = profile(model, step, iters=2, warmup=1)
    verify_trace(trace)
    assert {t.name for t in trace.tensors} == {n for n, _ in model.named_parameters()}
    w = trace.tensor_map()["encoder.weight_hh_l0"]
    assert w.consumers  # the recurrence reads it at each time step (or in one fused op)


def test_trace_compiles() -> None:
    from pace.lp import schedule

    _, trace = _cnn_trace()
    sched = schedule(trace, FusionPlan.singletons(trace)).schedule
    verify_schedule(sched, trace)
    assert sched.predicted_iteration_us > 0


def test_kineto_and_pace_durations_agree() -> None:
    """Same executions measured twice: by pace's hooks and by torch.profiler (Kineto).

    Profiling under Kineto compares the two clocks on the *same* op executions, so the load of a
    shared machine does not enter the comparison. Tolerance (stated in docs/profiler.md): each
    op's median within 25% + 50 us, the totals within 15%.
    """
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as kineto

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.Flatten(),
        nn.Linear(32 * 16 * 16, 10),
    )
    x = torch.randn(4, 3, 16, 16)
    iters, warmup = 7, 1  # an odd count: the median is one real execution, not a mean of two
    with kineto(activities=[ProfilerActivity.CPU]) as prof:
        trace = profile(
            model,
            lambda m: m(x).square().mean(),
            iters=iters,
            warmup=warmup,
            timing="kernel",
            calibrate=0,  # only the recorded iterations inside Kineto's window
        )
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        parent = e.cpu_parent.name if e.cpu_parent is not None else ""
        # Our dispatch mode re-runs the op: Kineto shows it under "PythonDispatchMode", and
        # that inner event spans exactly what pace times (the outer one adds our bookkeeping).
        if e.name in ("aten::convolution", "aten::addmm") and parent == "PythonDispatchMode":
            by_kind[e.name.removeprefix("aten::")].append(e.cpu_time_total)
        elif e.name in ("ConvolutionBackward0", "AddmmBackward0"):
            by_kind[e.name].append(e.cpu_time_total)

    checked = 0
    pace_total = kineto_total = 0.0
    for kind, times in by_kind.items():
        ours = [o.duration_us for o in trace.ops if _kind_of(o.name) == kind]
        assert len(times) == len(ours) * (iters + warmup), kind
        per_iter = [times[i * len(ours) : (i + 1) * len(ours)] for i in range(warmup + iters)]
        for j, mine in enumerate(ours):
            theirs = statistics.median(it[j] for it in per_iter[warmup:])
            assert abs(mine - theirs) <= 0.25 * max(mine, theirs) + 50.0, (kind, mine, theirs)
            pace_total += mine
            kineto_total += theirs
            checked += 1
    assert checked == 8  # 3 conv + 1 addmm, forward and backward
    assert abs(pace_total - kineto_total) <= 0.15 * kineto_total


def test_span_timing_adds_up_to_the_passes() -> None:
    _, trace = _cnn_trace(timing="span")
    assert trace.meta["timing"] == "span"
    assert all(op.duration_us >= 0 for op in trace.ops)
    bw = sum(o.duration_us for o in trace.ops if o.phase == "backward")
    # Backward spans tile the measured backward wall time (medians of sums vs sums of medians
    # differ a little, hence the loose bound; this checks bookkeeping, not speed).
    assert 0.5 * trace.meta["backward_wall_us"] <= bw <= 1.5 * trace.meta["backward_wall_us"]
    # The un-instrumented passes are recorded so the profiler's overhead can be read off.
    assert trace.meta["uninstrumented_forward_us"] > 0
    assert trace.meta["uninstrumented_backward_us"] > 0


def test_the_optimizer_step_becomes_the_update_cost_per_byte() -> None:
    """pace's overlapped runtime runs the step piecewise as gradients are reduced: the profile
    stores its cost per byte of gradient (comm.update_us_per_byte); without an optimizer, 0."""
    _, plain = _cnn_trace()
    assert plain.comm.update_us_per_byte == 0.0
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(2, 3, 8, 8)
    y = torch.tensor([1, 3])

    def step(m: nn.Module) -> torch.Tensor:
        return nn.functional.cross_entropy(m(x), y)

    trace = profile(model, step, iters=2, warmup=1, optimizer=opt)
    assert trace.meta["optimizer_us"] > 0
    assert trace.comm.update_us_per_byte == pytest.approx(
        trace.meta["optimizer_us"] / trace.total_bytes
    )


def test_the_profile_measures_the_runtime_s_copy_back_per_byte() -> None:
    """pace's runtime copies a fused unit's reduced buffer back into its gradients: the profile
    times that call on the gradients' device and dtype (comm.copy_us_per_byte), a rate of the
    memory that even a model of a few kilobytes gets right."""
    _, trace = _cnn_trace()
    assert trace.total_bytes < 1 << 20
    # Between 1 GB/s and 100 TB/s: a real memory copy on any host or device.
    assert 1e-8 < trace.comm.copy_us_per_byte < 1e-3
    # A comm model that already carries one keeps it (a trace profiled elsewhere).
    given = dataclasses.replace(trace.comm, copy_us_per_byte=0.5)
    _, kept = _cnn_trace(comm=given)
    assert kept.comm.copy_us_per_byte == 0.5


# --- bad input ----------------------------------------------------------------------------------


def test_model_without_parameters_is_refused() -> None:
    with pytest.raises(InputError, match="no trainable parameters"):
        profile(nn.ReLU(), lambda m: m(torch.ones(1, requires_grad=True)).sum())


def test_step_function_that_raises_is_refused() -> None:
    def bad(_m: nn.Module) -> torch.Tensor:
        raise RuntimeError("boom")

    with pytest.raises(InputError, match="step function raised RuntimeError: boom"):
        profile(nn.Linear(2, 2), bad)


def test_step_function_must_return_a_scalar_loss() -> None:
    with pytest.raises(InputError, match="scalar loss"):
        profile(nn.Linear(2, 2), lambda m: m(torch.ones(3, 2)))
    with pytest.raises(InputError, match="does not require grad"):
        profile(nn.Linear(2, 2), lambda m: torch.ones(()))


def test_loss_independent_of_the_model_is_refused() -> None:
    w = torch.ones(2, requires_grad=True)
    with pytest.raises(InputError, match="no parameter received a gradient"):
        profile(nn.Linear(2, 2), lambda m: (w * 2).sum())


@pytest.mark.parametrize(
    ("opts", "field"),
    [({"iters": 0}, "iters"), ({"warmup": -1}, "warmup"), ({"threads": 0}, "threads")],
)
def test_bad_options(opts: dict[str, int], field: str) -> None:
    with pytest.raises(InputError) as exc:
        profile(nn.Linear(2, 2), lambda m: m(torch.ones(1, 2)).sum(), **opts)  # type: ignore[arg-type]
    assert exc.value.field == field


def test_unknown_models_are_refused() -> None:
    with pytest.raises(InputError, match="did you mean resnet50"):
        build_workload("torchvision:resnet5", batch_size=1)
    with pytest.raises(InputError, match="unknown model 'nope'"):
        build_workload("nope", batch_size=1)


# --- CUDA path (no GPU here: the event clock is driven by a stand-in for torch.cuda) ----------


class _FakeEvent:
    """Mimics torch.cuda.Event on the host: record() stamps, elapsed_time() in ms."""

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.t_ns = -1

    def record(self) -> None:
        import time

        self.t_ns = time.perf_counter_ns()

    def elapsed_time(self, other: _FakeEvent) -> float:
        assert self.t_ns >= 0
        assert other.t_ns >= 0
        return (other.t_ns - self.t_ns) / 1e6


def test_cuda_event_clock_path_runs_with_a_stand_in() -> None:
    import types

    from pace.profiler.clock import CudaEventClock

    synced: list[int] = []
    fake = types.SimpleNamespace(
        cuda=types.SimpleNamespace(Event=_FakeEvent, synchronize=lambda: synced.append(1))
    )
    clock = CudaEventClock()
    clock._torch = fake  # type: ignore[assignment]
    _, trace = _cnn_trace(clock=clock)
    verify_trace(trace)
    assert trace.meta["clock"] == "cuda-events"
    # One synchronisation per iteration, not per op.
    assert len(synced) == 3
    _, host = _cnn_trace()
    assert [(o.name, o.deps) for o in trace.ops] == [(o.name, o.deps) for o in host.ops]


def _producers(model: nn.Module, step: object, *, accumulate_hook: bool) -> dict[str, str]:
    from pace.ir import CommModel
    from pace.profiler.clock import HostClock
    from pace.profiler.record import Recorder
    from pace.profiler.window import ParamInfo, build_window

    records = []
    with Recorder(model, HostClock(), accumulate_hook=accumulate_hook) as rec:
        for _ in range(2):
            for p in model.parameters():
                p.grad = None
            records.append(rec.iteration(lambda: step(model), None))  # type: ignore[operator]
    assert bool(records[-1].grad_ready) == accumulate_hook
    params = [
        ParamInfo(name=n, size_bytes=p.numel() * p.element_size())
        for n, p in model.named_parameters()
        if p.grad is not None
    ]
    trace = build_window(
        records,
        params=params,
        comm=CommModel(workers=2, alpha_us=0.0, beta_us_per_byte=1.0),
        model_name="m",
    )
    verify_trace(trace)
    return {t.name: t.producer for t in trace.tensors}


def test_graph_fallback_finds_the_same_producers_as_the_accumulate_hook() -> None:
    """Without register_post_accumulate_grad_hook (torch < 2.1) the autograd graph decides."""
    torch.manual_seed(0)
    cnn = SmallCNN()
    x = torch.randn(2, 3, 8, 8)

    def cnn_step(m: nn.Module) -> torch.Tensor:
        out: torch.Tensor = m(x).square().mean()
        return out

    gpt = TinyGPT(vocab=30, d_model=8, n_layers=1, n_heads=2)
    tokens = torch.randint(0, 30, (2, 5))

    def gpt_step(m: nn.Module) -> torch.Tensor:
        out: torch.Tensor = m(tokens).logsumexp(-1).mean()
        return out

    for model, step in ((cnn, cnn_step), (gpt, gpt_step)):
        hooked = _producers(model, step, accumulate_hook=True)
        fallback = _producers(model, step, accumulate_hook=False)
        assert fallback == hooked


def test_in_place_writer_becomes_the_producer() -> None:
    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.conv(x)
            h.relu_()  # in place: readers of h now depend on relu_, not on the conv
            out: torch.Tensor = (h * 3.0).sum()
            return out

    trace = profile(InPlace(), lambda m: m(torch.randn(1, 1, 5, 5)), order_edges=False)
    fw = [o for o in trace.ops if o.phase == "forward"]
    by_kind = {_kind_of(o.name): o for o in fw}
    assert [_kind_of(d) for d in by_kind["relu_"].deps] == ["convolution"]
    assert [_kind_of(d) for d in by_kind["mul"].deps] == ["relu_"]
