"""Every file in tests/data/bad/ is refused by ``pace validate`` with exit 2 and ONE stderr line
that names the file and the offending field — never a traceback.

Files named ``schedule_*`` are validated against tests/data/tiny.trace.json (``--trace``).
A new bad file must be added to ``EXPECTED`` (the test fails otherwise), so the folder and the
list of malformations it documents cannot drift apart.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pace.cli import main

DATA = Path(__file__).parent / "data"
BAD = DATA / "bad"
TINY = DATA / "tiny.trace.json"
REPO = Path(__file__).resolve().parent.parent

# file -> (field named after "file: ", regex the rest of the message must contain).
# field "" means a whole-file problem (not JSON, not gzip, empty, ...).
EXPECTED: dict[str, tuple[str, str]] = {
    "truncated.json": ("", r"not valid JSON: .*\(file truncated\?\)"),
    "empty.json": ("", r"empty file"),
    "not_object.json": ("", r"expected a JSON object, got a list"),
    "not_utf8.json": ("", r"not UTF-8"),
    "gzip_garbage.json.gz": ("", r"not a valid gzip file"),
    "gzip_truncated.json.gz": ("", r"not a valid gzip file"),
    "wrong_format.json": (
        "format",
        r"expected 'pace.trace' or 'pace.schedule', got 'pace.schedul'",
    ),
    "missing_format.json": ("format", r"got missing"),
    "wrong_version.json": ("version", r"unsupported version 2 \(supported: 1\)"),
    "version_string.json": ("version", r'unsupported version "1"'),
    "missing_ops.json": ("ops", r"missing required key"),
    "missing_comm.json": ("comm", r"missing required key"),
    "missing_bytes.json": ("tensors[1].bytes", r"missing required key"),
    "missing_duration.json": ("ops[2].duration_us", r"missing required key"),
    "ops_not_list.json": ("ops", r"must be a list, got an object"),
    "op_not_object.json": ("ops[1]", r"must be an object, got a string"),
    "deps_not_list.json": ("ops[1].deps", r"must be a list, got a string"),
    "name_not_string.json": ("ops[0].name", r"must be a string, got an integer"),
    "bool_duration.json": ("ops[0].duration_us", r"must be a number, got true"),
    "string_duration.json": ("ops[0].duration_us", r'must be a number, got "10"'),
    "null_duration.json": ("ops[0].duration_us", r"must be a number, got null"),
    "nan_duration.json": ("ops[2].duration_us", r"NaN, Infinity .* refused"),
    "infinity_alpha.json": ("comm.alpha_us", r"NaN, Infinity .* refused"),
    "overflow_beta.json": ("comm.beta_us_per_byte", r"out of float range"),
    "duplicate_key.json": ("tensors[1]", r"duplicate key 'bytes'"),
    "negative_duration.json": ("ops[3].duration_us", r"must be >= 0, got -5"),
    "bytes_zero.json": ("tensors[0].bytes", r"integer > 0, got 0"),
    "element_bytes_not_power_of_two.json": (
        "tensors[0].element_bytes",
        r"power of two that divides bytes \(20\), got 3",
    ),
    "element_bytes_not_dividing.json": (
        "tensors[1].element_bytes",
        r"power of two that divides bytes \(4\), got 8",
    ),
    "element_bytes_string.json": ("tensors[0].element_bytes", r"must be an integer"),
    "bytes_negative.json": ("tensors[0].bytes", r"integer > 0, got -20"),
    "bytes_float.json": ("tensors[0].bytes", r"integer > 0, got 20.5"),
    "bytes_integral_float.json": ("tensors[0].bytes", r"integer > 0, got 20.0"),
    "bytes_bool.json": ("tensors[0].bytes", r"integer > 0, got true"),
    "workers_zero.json": ("comm.workers", r"integer > 0, got 0"),
    "workers_float.json": ("comm.workers", r"integer > 0, got 2.5"),
    "negative_beta.json": ("comm.beta_us_per_byte", r">= 0, got -1"),
    "bad_phase.json": ("ops[0].phase", r"must be one of forward, backward, optimizer, other"),
    "samples_not_pairs.json": ("comm.samples[1]", r"\[bytes, us\] pair"),
    "meta_not_object.json": ("meta", r"must be an object, got a string"),
    "duplicate_op.json": ("ops[3].name", r"duplicate op name 'fw.layer1' \(first at ops\[2\]\)"),
    "duplicate_tensor.json": ("tensors[1].name", r"duplicate tensor name 'layer2.weight'"),
    "unknown_dep.json": ("ops[2].deps[0]", r"op 'bw.layer0' does not exist"),
    "unknown_producer.json": ("tensors[1].producer", r"op 'bw.fc' does not exist"),
    "unknown_consumer.json": ("tensors[0].consumers[0]", r"op 'fw.layer3' does not exist"),
    "cycle.json": (
        "ops[1].deps",
        r"dependency cycle: bw.layer2 -> bw.layer1 -> fw.layer1 -> fw.layer2 -> bw.layer2",
    ),
    "self_dep.json": ("ops[1].deps", r"dependency cycle: bw.layer1 -> bw.layer1"),
    "lemma1.json": ("tensors[0].producer", r"Lemma-1 rule broken: producer 'fw.layer1'"),
    "no_tensors.json": ("tensors", r"at least one gradient tensor"),
    "schedule_gap.json": ("units", r"'layer2.weight': bytes \[10, 12\) are not covered"),
    "schedule_overlap.json": (
        "units[2].slices[0]",
        r"'layer2.weight': bytes \[8, 10\) are also covered by units\[0\].slices\[0\]",
    ),
    "schedule_past_end.json": ("units[1].slices[0]", r"run past the end of tensor 'layer1.weight'"),
    "schedule_unknown_tensor.json": (
        "units[1].slices[0].tensor",
        r"tensor 'layer3.weight' does not exist",
    ),
    "schedule_missing_tensor.json": ("units", r"'layer1.weight' \(4 bytes\) is not covered"),
    "schedule_digest_mismatch.json": ("trace_digest", r"compiled for trace 'sha256:abab"),
    "schedule_wrong_version.json": ("version", r"unsupported version 0"),
    "schedule_missing_units.json": ("units", r"missing required key"),
    "schedule_empty_slices.json": ("units[0].slices", r"must not be empty"),
    "schedule_offset_float.json": ("units[2].slices[0].offset", r"integer >= 0, got 10.0"),
    "schedule_bool_priority.json": ("units[0].priority", r"must be a number, got false"),
    "schedule_negative_predicted.json": ("predicted_iteration_us", r">= 0, got -39"),
    "schedule_nan_priority.json": ("units[1].priority", r"NaN, Infinity"),
    "schedule_missing_cost_model.json": ("cost_model", r"missing required key"),
    "schedule_wrong_prediction.json": (
        "predicted_iteration_us",
        r"file says 44 us, but replaying this schedule on the trace gives 39 us",
    ),
    # Bounds (docs/trace-format.md, "Bounds"): numbers the domain cannot have, refused where
    # the file is read, so that no stage overflows, divides into NaN or loops for ever.
    "bytes_too_large.json": ("tensors[0].bytes", r"must be <= 281474976710656 \(2\*\*48 bytes"),
    "bytes_over_64_bits.json": ("tensors[0].bytes", r"integer 1180591620717411303424 out of range"),
    "huge_int_in_meta.json": ("meta.batch", r"integer 100000000000\.\.\. \(5001 digits\) out of"),
    "total_bytes_too_large.json": ("tensors[1].bytes", r"hold 281474976710664 bytes together"),
    "duration_too_long.json": ("ops[1].duration_us", r"must be <= 8.64e\+10 \(one day in us\)"),
    "duration_subnormal.json": ("ops[2].duration_us", r"must be 0 or >= 1e-100 .*got 5e-324"),
    "workers_too_many.json": ("comm.workers", r"must be <= 1048576 \(2\*\*20 workers\)"),
    "beta_too_slow.json": ("comm.beta_us_per_byte", r"must be <= 1e\+06 \(one byte per second\)"),
    "lone_surrogate.json": ("ops[0].name", r"not valid Unicode: lone surrogate escape \\ud800"),
    "newline_name_cycle.json": (
        "ops[1].deps",
        r"dependency cycle: bw\.layer2 -> bw\.layer1\\nsecond line -> fw\.layer1",
    ),
    "schedule_speedup_zero.json": ("meta.compute_speedup", r"must be a number in \[0.001, 1e"),
    "schedule_offset_over_64_bits.json": (
        "units[0].slices[0].offset",
        r"integer 9223372036854775808 out of range",
    ),
}


def argv_for(name: str) -> list[str]:
    args = ["validate", str(BAD / name)]
    if name.startswith("schedule_"):
        args += ["--trace", str(TINY)]
    return args


def check_line(name: str, stderr: str) -> None:
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    field, pattern = EXPECTED[name]
    prefix = f"pace: {BAD / name}: " + (f"{field}: " if field else "")
    line = lines[0]
    assert line.startswith(prefix), f"{line!r} does not start with {prefix!r}"
    assert re.search(pattern, line[len(prefix) :]), line


def test_every_bad_file_is_listed() -> None:
    assert sorted(p.name for p in BAD.iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_in_process(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv_for(name)) == 2
    out = capsys.readouterr()
    assert out.out == ""
    check_line(name, out.err)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_cli(name: str) -> None:
    # The real entry point (python -m pace) in a fresh interpreter: exit code and stderr as a
    # user sees them.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "pace", *argv_for(name)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    check_line(name, proc.stderr)


def test_good_files_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(TINY)]) == 0
    assert "valid trace" in capsys.readouterr().out
    assert main(["validate", str(DATA / "tiny.schedule.json"), "--trace", str(TINY)]) == 0
    assert "valid schedule" in capsys.readouterr().out


def test_json_summaries(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(TINY), "--json"]) == 0
    trace_summary = json.loads(capsys.readouterr().out)
    assert trace_summary == {
        "file": str(TINY),
        "kind": "trace",
        "valid": True,
        "model": "tiny-2-layer",
        "ops": 4,
        "tensors": 2,
        "total_bytes": 24,
        "trace_digest": trace_summary["trace_digest"],
    }
    assert trace_summary["trace_digest"].startswith("sha256:")
    schedule = str(DATA / "tiny.schedule.json")
    assert main(["validate", schedule, "--trace", str(TINY), "--json"]) == 0
    sched_summary = json.loads(capsys.readouterr().out)
    assert sched_summary["kind"] == "schedule"
    assert sched_summary["checked_against_trace"] is True
    assert sched_summary["units"] == 3
    assert sched_summary["predicted_iteration_us"] == 39.0
    assert sched_summary["trace_digest"] == trace_summary["trace_digest"]


def test_schedule_against_a_bad_trace_names_the_trace(capsys: pytest.CaptureFixture[str]) -> None:
    bad_trace = BAD / "cycle.json"
    code = main(["validate", str(DATA / "tiny.schedule.json"), "--trace", str(bad_trace)])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"pace: {bad_trace}: ops[1].deps: dependency cycle")


def test_trace_option_on_a_trace_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(TINY), "--trace", str(TINY)]) == 2
    assert capsys.readouterr().err == "pace: --trace: only applies when FILE is a schedule\n"


def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["validate", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "none.json: cannot read file" in err
