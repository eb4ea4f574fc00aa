"""Reading and writing trace and schedule files (docs/trace-format.md, docs/schedule-format.md).

Files are JSON, optionally gzip-compressed (``.json.gz``; a gzip file is recognised by its magic
bytes or a ``.gz`` suffix). Parsing is strict: every problem raises ``InputError`` naming the file
and the JSON path of the field, e.g. ``trace.json: tensors[3].bytes: must be an integer > 0, got
4.5``.

Strictness rules (user-facing copy in docs/trace-format.md):

* Non-standard JSON is refused: ``NaN``, ``Infinity``, numbers that overflow to infinity (``1e400``)
  and duplicate keys in one object (``json`` would silently keep the last one).
* ``true``/``false`` are not numbers (Python's ``bool`` is an ``int``; JSON's is not).
* Integers fields (``bytes``, ``offset``, ``workers``) must be JSON integers: ``4.0`` is refused, so
  a profiler bug that produces fractional sizes is caught at the border.
* Unknown keys are ignored at every level, so that a v1 reader accepts files written by a later
  v1-compatible writer that adds fields. They are not kept: ``save(load(f))`` drops them.
* Numbers must fit the domain (the bounds below, user-facing copy in docs/trace-format.md,
  "Bounds"): every JSON integer fits in 64 bits, sizes, durations, costs and counts have upper
  bounds, so that no later stage can overflow, divide into NaN or loop for ever on a number a
  file made up. Strings must be valid Unicode (no lone surrogate escapes such as ``"\\ud800"``,
  which Python accepts but can neither print nor write back as UTF-8).
* Only regular files are read (a FIFO would block, ``/dev/zero`` never ends), and at most
  ``MAX_FILE_BYTES`` of JSON text, also after gunzip.

Every file is written atomically (``write_atomic``): a reader, or a training job starting at that
moment, sees the old file or the new one, never a truncated mix.

``load_trace`` and ``load_schedule`` also run the structural checks of ``pace.verify`` (names,
references, cycles, Lemma 1, coverage), so every stage receives a checked object.

``trace_digest`` identifies the computation a schedule was compiled for; it lives in
``pace.digest`` (re-exported here), the bounds of the domain in ``pace.bounds`` (re-exported).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import re
import secrets
import stat
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pace.bounds import (
    MAX_BETA_US_PER_BYTE,
    MAX_COMPUTE_SPEEDUP,
    MAX_DURATION_US,
    MAX_FILE_BYTES,
    MAX_ITEMS,
    MAX_JSON_INT,
    MAX_SLICES,
    MAX_TENSOR_BYTES,
    MAX_WORKERS,
    MIN_COMPUTE_SPEEDUP,
    MIN_NONZERO_BETA_US_PER_BYTE,
    MIN_NONZERO_US,
)
from pace.checks import is_int, is_number
from pace.digest import DIGEST_PREFIX, trace_digest
from pace.errors import InputError
from pace.ir import (
    FRAMEWORK_BACKENDS,
    MAX_COMPUTE_LOSS,
    CommModel,
    FrameworkPath,
    Interference,
    Op,
    Schedule,
    Slice,
    Tensor,
    Trace,
    Unit,
)
from pace.options import PHASES, SCHEDULE_MODES

# The public names; the bounds (pace.bounds) and the digest (pace.digest) are re-exported:
# callers have always imported them from here.
__all__ = [
    "DIGEST_PREFIX",
    "MAX_BETA_US_PER_BYTE",
    "MAX_COMPUTE_SPEEDUP",
    "MAX_DURATION_US",
    "MAX_FILE_BYTES",
    "MAX_ITEMS",
    "MAX_JSON_INT",
    "MAX_SLICES",
    "MAX_TENSOR_BYTES",
    "MAX_WORKERS",
    "MIN_COMPUTE_SPEEDUP",
    "MIN_NONZERO_BETA_US_PER_BYTE",
    "MIN_NONZERO_US",
    "SCHEDULE_FORMAT",
    "SUPPORTED_SCHEDULE_VERSIONS",
    "SUPPORTED_TRACE_VERSIONS",
    "TRACE_FORMAT",
    "PathLike",
    "check_compute_speedup",
    "display_path",
    "framework_from_dict",
    "framework_to_dict",
    "interference_from_dict",
    "interference_to_dict",
    "load_json",
    "load_schedule",
    "load_trace",
    "save_schedule",
    "save_trace",
    "schedule_from_dict",
    "schedule_to_dict",
    "trace_digest",
    "trace_from_dict",
    "trace_to_dict",
    "write_atomic",
]

TRACE_FORMAT = "pace.trace"
SCHEDULE_FORMAT = "pace.schedule"
SUPPORTED_TRACE_VERSIONS: tuple[int, ...] = (1,)
SUPPORTED_SCHEDULE_VERSIONS: tuple[int, ...] = (1,)
_GZIP_MAGIC = b"\x1f\x8b"

PathLike = str | os.PathLike[str]
T = TypeVar("T")

# ---------------------------------------------------------------------------------------------
# Bounds of the domain (docs/trace-format.md, "Bounds"): the numbers are in pace.bounds, their
# explanations in messages here.

_WHY_BYTES = "2**48 bytes, 256 TiB"
_WHY_WORKERS = "2**20 workers"


@dataclass(frozen=True)
class _Range:
    """Bounds of a nonnegative number field: at most ``most``, and 0 or at least ``least``."""

    most: float
    why: str
    least: float = 0.0
    least_why: str = ""


_TINY = "smaller is no time: a day divided by it overflows"
_US = _Range(MAX_DURATION_US, "one day in us", MIN_NONZERO_US, _TINY)
_BETA = _Range(MAX_BETA_US_PER_BYTE, "one byte per second", MIN_NONZERO_BETA_US_PER_BYTE, _TINY)

# ---------------------------------------------------------------------------------------------
# Raw JSON


class _DupKeyDict(dict[str, Any]):
    """A JSON object that had a repeated key; ``_find_bad`` reports it with its path."""

    dup_key: str = ""


class _BadInt:
    """Stands in for an integer literal beyond 64 bits until ``_find_bad`` names its path."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _Flags:
    def __init__(self) -> None:
        self.bad = False


# A JSON escape of a UTF-16 surrogate; only a lone one survives decoding (a pair becomes one
# character), so this only decides whether the slower walk looking for one is needed.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# Longest 64-bit integer literal: "-9223372036854775808".
_MAX_INT_CHARS = 20


def _decode(text: str, where: str) -> Any:
    flags = _Flags()
    flags.bad = _SURROGATE_ESCAPE.search(text) is not None

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items):
            seen: set[str] = set()
            dup = ""
            for k, _ in items:
                if k in seen:
                    dup = k
                    break
                seen.add(k)
            flags.bad = True
            bad = _DupKeyDict(obj)
            bad.dup_key = dup
            return bad
        return obj

    def parse_float(s: str) -> float:
        x = float(s)
        if not math.isfinite(x):
            flags.bad = True
        return x

    def parse_int(s: str) -> int | _BadInt:
        # Checked on the text first: int() of a literal over 4,300 digits raises ValueError.
        if len(s) <= _MAX_INT_CHARS:
            v = int(s)
            if -MAX_JSON_INT - 1 <= v <= MAX_JSON_INT:
                return v
        flags.bad = True
        return _BadInt(s)

    def parse_constant(s: str) -> float:
        flags.bad = True
        return float(s)

    try:
        obj = json.loads(
            text,
            object_pairs_hook=pairs,
            parse_float=parse_float,
            parse_int=parse_int,
            parse_constant=parse_constant,
        )
    except json.JSONDecodeError as exc:
        if not text.strip():
            raise InputError("empty file, expected a JSON object", where=where) from None
        hint = " (file truncated?)" if exc.pos >= len(text.rstrip()) else ""
        raise InputError(
            f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}){hint}",
            where=where,
        ) from None
    except RecursionError:
        raise InputError("not valid JSON: nested too deeply", where=where) from None
    except ValueError as exc:
        # None known (parse_int keeps int() from its 4,300-digit ValueError); any other stays
        # an error about the file, not a traceback.
        raise InputError(f"not valid JSON: {exc}", where=where) from None
    if flags.bad:
        # Found only now so the message can carry the JSON path of the offending value.
        try:
            _find_bad(obj, "", where)
        except RecursionError:
            raise InputError(
                "not valid JSON: a number out of range, a lone surrogate or a duplicate key, "
                "nested too deeply to locate",
                where=where,
            ) from None
    return obj


def _join(path: str, key: str) -> str:
    # Quote odd keys so a path stays one readable line whatever the file contains.
    if not key or not key.isprintable() or any(c in key for c in ".[] "):
        key = json.dumps(key)
    return f"{path}.{key}" if path else key


def _find_bad(obj: Any, path: str, where: str) -> None:
    field = path or "(top level)"
    if isinstance(obj, float) and not math.isfinite(obj):
        raise InputError(
            "not a valid JSON number: NaN, Infinity and numbers out of float range are refused",
            where=where,
            field=field,
        )
    if isinstance(obj, _BadInt):
        digits = len(obj.text.lstrip("-"))
        shown = obj.text if len(obj.text) <= 24 else f"{obj.text[:12]}... ({digits} digits)"
        raise InputError(
            f"integer {shown} out of range: JSON integers must fit in 64 bits "
            f"(magnitude <= {MAX_JSON_INT})",
            where=where,
            field=field,
        )
    if isinstance(obj, str):
        _check_unicode(obj, where, field)
    elif isinstance(obj, _DupKeyDict):
        raise InputError(f"duplicate key {obj.dup_key!r}", where=where, field=field)
    if isinstance(obj, dict):
        for k, v in obj.items():
            _check_unicode(k, where, _join(path, k))
            _find_bad(v, _join(path, k), where)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _find_bad(v, f"{path}[{i}]", where)


def _check_unicode(s: str, where: str, field: str) -> None:
    bad = _SURROGATE.search(s)
    if bad is not None:
        raise InputError(
            f"not valid Unicode: lone surrogate escape \\u{ord(bad.group()):04x} at character "
            f"{bad.start()} (a name must be text that can be printed and written as UTF-8)",
            where=where,
            field=field,
        )


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _file_kind(mode: int) -> str:
    for test, name in _FILE_KINDS:
        if test(mode):
            return name
    return "not a regular file"


def display_path(path: PathLike) -> str:
    """``path`` as errors name it: an empty name would otherwise vanish from the message."""
    text = os.fspath(path)
    return text if text else "''"


def _read_regular(path: PathLike, where: str) -> bytes:
    """The bytes of regular file ``path``, at most ``MAX_FILE_BYTES`` of them.

    Opened non-blocking and checked with ``fstat`` on the open descriptor (no window between a
    check and the open): a FIFO would block ``read`` until a writer comes, a device such as
    ``/dev/zero`` never ends.
    """
    if not os.fspath(path):
        raise InputError("empty file name", where=where)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror or exc}", where=where) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(
                f"not a regular file ({_file_kind(st.st_mode)}): give a trace or schedule file",
                where=where,
            )
        if st.st_size > MAX_FILE_BYTES:
            raise InputError(
                f"file too large: {st.st_size} bytes, at most {MAX_FILE_BYTES} are read",
                where=where,
            )
        chunks = []
        left = MAX_FILE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror or exc}", where=where) from None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    if len(raw) > MAX_FILE_BYTES:
        raise InputError(f"file too large: more than {MAX_FILE_BYTES} bytes", where=where)
    return raw


def _gunzip(raw: bytes, where: str) -> bytes:
    # Bounded: a few KiB of gzip can inflate to gigabytes.
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw), mode="rb") as gz:
            out = gz.read(MAX_FILE_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"not a valid gzip file: {exc}", where=where) from None
    if len(out) > MAX_FILE_BYTES:
        raise InputError(f"not read: decompresses to more than {MAX_FILE_BYTES} bytes", where=where)
    return out


def load_json(path: PathLike) -> dict[str, Any]:
    """The strict JSON object in file ``path`` (gzip or plain); raises ``InputError``."""
    where = display_path(path)
    raw = _read_regular(path, where)
    if raw.startswith(_GZIP_MAGIC) or where.endswith(".gz"):
        raw = _gunzip(raw, where)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", where=where) from None
    obj = _decode(text, where)
    if not isinstance(obj, dict):
        raise InputError(f"expected a JSON object, got {_kind(obj)}", where=where)
    return cast(dict[str, Any], obj)


def _format(obj: Mapping[str, Any]) -> str:
    """JSON with one line per top-level key and per list element of ops/tensors/units.

    Readable and diffable (a changed op is a one-line diff) without the bulk of full indentation.
    """
    lines = []
    for key, value in obj.items():
        head = f" {json.dumps(key)}: "
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            items = [
                "  " + json.dumps(v, allow_nan=False, ensure_ascii=False, separators=(", ", ": "))
                for v in value
            ]
            lines.append(head + "[\n" + ",\n".join(items) + "\n ]")
        else:
            lines.append(
                head
                + json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(", ", ": "))
            )
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _dump(obj: Mapping[str, Any], path: PathLike) -> None:
    # allow_nan=False (in _format): never write a file our own loader would refuse.
    try:
        text = _format(obj)
    except (TypeError, ValueError, RecursionError) as exc:
        # meta is free-form: a caller may have put a non-JSON value (or NaN) in it.
        raise InputError(f"cannot write as JSON: {exc}", where=display_path(path)) from None
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        # A Trace built in Python may carry a lone surrogate; a file never would (see _decode).
        raise InputError(
            f"cannot write as UTF-8: {exc.reason} at character {exc.start}",
            where=display_path(path),
        ) from None
    if os.fspath(path).endswith(".gz"):
        # mtime=0: the same trace always gives the same bytes (diffable, cacheable).
        data = gzip.compress(data, mtime=0)
    write_atomic(path, data)


def write_atomic(path: PathLike, data: bytes) -> None:
    """Replace the file ``path`` by ``data`` so that a reader sees the old file or the new one.

    ``data`` goes to a temporary file in the same directory (same file system, so the rename is
    atomic), is flushed and fsync'ed, and is renamed over ``path``; the directory is then
    fsync'ed so the rename itself survives a crash. Killed at any point, the process leaves
    ``path`` as it was or complete (at worst a stray ``.NAME.<8 random characters>.tmp``
    beside it after a SIGKILL; on an error or an interrupt the temporary file is removed). A
    symbolic link keeps pointing at the new file, and an existing file keeps its permission
    bits. A target that
    exists but is not a regular file (``/dev/null``, ``/dev/stdout``, a FIFO) cannot be
    renamed over and is written in place. Every writer of a user file in pace goes through this.
    Raises ``InputError`` naming ``path``.
    """
    where = display_path(path)
    target = os.fspath(path)
    if not target:
        raise InputError("empty file name: give the file to write", where=where)
    real = os.path.realpath(target)
    try:
        st: os.stat_result | None = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise InputError(f"cannot write file: {exc.strerror or exc}", where=where) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise InputError("cannot write file: is a directory", where=where)
    if st is not None and not stat.S_ISREG(st.st_mode):
        try:
            with open(real, "wb") as fh:
                fh.write(data)
        except OSError as exc:
            raise InputError(f"cannot write file: {exc.strerror or exc}", where=where) from None
        return
    directory = os.path.dirname(real) or "."
    # Hidden, recognisable, unique; the name is cut so that the suffix never overflows NAME_MAX.
    tmp = os.path.join(directory, f".{os.path.basename(real)[:200]}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        raise InputError(f"cannot write file: {exc.strerror or exc}", where=where) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            if st is not None:
                os.fchmod(fh.fileno(), stat.S_IMODE(st.st_mode))
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, real)
    except BaseException as exc:
        # KeyboardInterrupt included: never leave the temporary file behind.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise InputError(f"cannot write file: {exc.strerror or exc}", where=where) from None
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: str) -> None:
    # Makes the rename durable; not every file system lets a directory be opened or synced.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------------------------
# Typed field readers. Each names the JSON path in its error.


_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "a boolean"),  # before int: bool is a subclass of int
    (int, "an integer"),
    (float, "a number"),
    (str, "a string"),
    (list, "a list"),
    (dict, "an object"),
)


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    for cls, name in _KINDS:
        if isinstance(v, cls):
            return name
    return type(v).__name__


def _show(v: Any) -> str:
    if isinstance(v, dict | list):
        return _kind(v)
    if is_int(v) and v.bit_length() > 128:
        # str() of an int over 4,300 digits raises; such a value can only come from Python.
        return f"an integer of {v.bit_length()} bits"
    text = json.dumps(v) if isinstance(v, str | bool | int | float) or v is None else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


class _Reader:
    def __init__(self, where: str) -> None:
        self.where = where

    def err(self, field: str, message: str) -> InputError:
        return InputError(message, where=self.where, field=field)

    def obj(self, v: Any, field: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self.err(field, f"must be an object, got {_kind(v)}")
        return v

    def req(self, obj: Mapping[str, Any], key: str, path: str) -> Any:
        if key not in obj:
            raise self.err(_join(path, key), "missing required key")
        return obj[key]

    def str_(self, v: Any, field: str, *, nonempty: bool = True) -> str:
        if not isinstance(v, str):
            raise self.err(field, f"must be a string, got {_kind(v)}")
        if nonempty and not v:
            raise self.err(field, "must be a non-empty string")
        return v

    def list_(self, v: Any, field: str) -> list[Any]:
        if not isinstance(v, list):
            raise self.err(field, f"must be a list, got {_kind(v)}")
        return v

    def int_(
        self,
        v: Any,
        field: str,
        *,
        minimum: int,
        maximum: int = MAX_JSON_INT,
        why: str = "64-bit integers",
    ) -> int:
        if not is_int(v) or v < minimum:
            want = "> 0" if minimum == 1 else f">= {minimum}"
            raise self.err(field, f"must be an integer {want}, got {_show(v)}")
        if v > maximum:
            raise self.err(field, f"must be <= {maximum} ({why}), got {_show(v)}")
        return v

    def bytes_(self, v: Any, field: str, *, minimum: int) -> int:
        """A byte count or offset: an integer within one tensor's bound."""
        return self.int_(v, field, minimum=minimum, maximum=MAX_TENSOR_BYTES, why=_WHY_BYTES)

    def num(
        self,
        v: Any,
        field: str,
        *,
        nonneg: bool = True,
        bound: _Range | None = None,
    ) -> float:
        if not is_number(v):
            raise self.err(field, f"must be a number, got {_show(v)}")
        x = float(v)
        if not math.isfinite(x):
            raise self.err(field, f"must be finite, got {_show(v)}")
        if nonneg and x < 0:
            raise self.err(field, f"must be >= 0, got {_show(v)}")
        if bound is not None and x > bound.most:
            raise self.err(field, f"must be <= {bound.most:g} ({bound.why}), got {_show(v)}")
        if bound is not None and 0 < x < bound.least:
            raise self.err(
                field, f"must be 0 or >= {bound.least:g} ({bound.least_why}), got {_show(v)}"
            )
        return x

    def names(self, v: Any, field: str) -> tuple[str, ...]:
        items = self.list_(v, field)
        # Fast path (the common, valid case); the slow path finds the bad element's index.
        if all(type(x) is str and x for x in items):
            return tuple(items)
        return tuple(self.str_(x, f"{field}[{i}]") for i, x in enumerate(items))

    def items(
        self, obj: Mapping[str, Any], key: str, path: str, parse: Callable[[Any, str], T]
    ) -> tuple[T, ...]:
        field = _join(path, key)
        seq = self.count(self.list_(self.req(obj, key, path), field), field)
        return tuple(parse(x, f"{field}[{i}]") for i, x in enumerate(seq))

    def count(self, seq: list[Any], field: str, maximum: int = MAX_ITEMS) -> list[Any]:
        if len(seq) > maximum:
            raise self.err(field, f"has {len(seq)} elements, at most {maximum} are allowed")
        return seq

    def header(self, obj: Mapping[str, Any], fmt: str, versions: tuple[int, ...]) -> None:
        got = self.req(obj, "format", "")
        if got != fmt:
            raise self.err("format", f"expected {fmt!r}, got {_show(got)}")
        version = self.req(obj, "version", "")
        if type(version) is not int or version not in versions:
            supported = ", ".join(str(v) for v in versions)
            raise self.err(
                "version", f"unsupported version {_show(version)} (supported: {supported})"
            )


# ---------------------------------------------------------------------------------------------
# Trace


def _op_from(r: _Reader, v: Any, path: str) -> Op:
    o = r.obj(v, path)
    phase = r.str_(r.req(o, "phase", path), f"{path}.phase")
    if phase not in PHASES:
        raise r.err(f"{path}.phase", f"must be one of {', '.join(PHASES)}; got {phase!r}")
    deps = r.names(o["deps"], f"{path}.deps") if "deps" in o else ()
    return Op(
        name=r.str_(r.req(o, "name", path), f"{path}.name"),
        phase=phase,
        duration_us=r.num(
            r.req(o, "duration_us", path),
            f"{path}.duration_us",
            bound=_US,
        ),
        deps=deps,
    )


def _tensor_from(r: _Reader, v: Any, path: str) -> Tensor:
    o = r.obj(v, path)
    consumers = r.names(o["consumers"], f"{path}.consumers") if "consumers" in o else ()
    return Tensor(
        name=r.str_(r.req(o, "name", path), f"{path}.name"),
        size_bytes=r.bytes_(r.req(o, "bytes", path), f"{path}.bytes", minimum=1),
        producer=r.str_(r.req(o, "producer", path), f"{path}.producer"),
        consumers=consumers,
        element_bytes=(
            r.int_(o["element_bytes"], f"{path}.element_bytes", minimum=1)
            if "element_bytes" in o
            else 1
        ),
        dtype=r.str_(o["dtype"], f"{path}.dtype") if "dtype" in o else "",
    )


def _comm_from(r: _Reader, v: Any, path: str, *, with_samples: bool = True) -> CommModel:
    o = r.obj(v, path)
    algorithm = r.str_(o["algorithm"], f"{path}.algorithm") if "algorithm" in o else "ring"
    samples: tuple[tuple[int, float], ...] = ()
    if with_samples and "samples" in o:
        field = f"{path}.samples"
        pts = []
        for i, pt in enumerate(r.count(r.list_(o["samples"], field), field)):
            if not isinstance(pt, list) or len(pt) != 2:
                raise r.err(f"{field}[{i}]", f"must be a [bytes, us] pair, got {_show(pt)}")
            pts.append(
                (
                    r.bytes_(pt[0], f"{field}[{i}][0]", minimum=0),
                    r.num(pt[1], f"{field}[{i}][1]", bound=_US),
                )
            )
        samples = tuple(pts)
    alpha_us = r.num(r.req(o, "alpha_us", path), f"{path}.alpha_us", bound=_US)
    batched_alpha_us = None
    if "batched_alpha_us" in o:
        batched_alpha_us = r.num(o["batched_alpha_us"], f"{path}.batched_alpha_us", bound=_US)
        if batched_alpha_us > alpha_us:
            raise r.err(
                f"{path}.batched_alpha_us",
                f"must be <= alpha_us ({alpha_us:g}): a call negotiated beside others costs "
                "no more than one alone; remove the key where it was not measured",
            )
    return CommModel(
        workers=r.int_(
            r.req(o, "workers", path),
            f"{path}.workers",
            minimum=1,
            maximum=MAX_WORKERS,
            why=_WHY_WORKERS,
        ),
        alpha_us=alpha_us,
        beta_us_per_byte=r.num(
            r.req(o, "beta_us_per_byte", path),
            f"{path}.beta_us_per_byte",
            bound=_BETA,
        ),
        algorithm=algorithm,
        samples=samples,
        interference=(
            _interference_from(r, o["interference"], f"{path}.interference")
            if "interference" in o
            else None
        ),
        update_us_per_byte=(
            r.num(o["update_us_per_byte"], f"{path}.update_us_per_byte", bound=_BETA)
            if "update_us_per_byte" in o
            else 0.0
        ),
        copy_us_per_byte=(
            r.num(o["copy_us_per_byte"], f"{path}.copy_us_per_byte", bound=_BETA)
            if "copy_us_per_byte" in o
            else 0.0
        ),
        framework=(
            _framework_from(r, o["framework"], f"{path}.framework") if "framework" in o else None
        ),
        batched_alpha_us=batched_alpha_us,
    )


FRAMEWORK_VERSIONS = (1,)


def _framework_from(r: _Reader, v: Any, path: str) -> FrameworkPath:
    """``comm.framework`` (optional, versioned; docs/trace-format.md)."""
    o = r.obj(v, path)
    version = r.int_(r.req(o, "version", path), f"{path}.version", minimum=1)
    if version not in FRAMEWORK_VERSIONS:
        raise r.err(f"{path}.version", f"version {version} is not supported (known: 1)")
    backend = r.str_(r.req(o, "backend", path), f"{path}.backend")
    if backend not in FRAMEWORK_BACKENDS:
        raise r.err(
            f"{path}.backend",
            f"must be one of {', '.join(FRAMEWORK_BACKENDS)}, got {_show(backend)}",
        )
    return FrameworkPath(
        backend=backend,
        alpha_us=r.num(r.req(o, "alpha_us", path), f"{path}.alpha_us", bound=_US),
        beta_us_per_byte=r.num(
            r.req(o, "beta_us_per_byte", path), f"{path}.beta_us_per_byte", bound=_BETA
        ),
        interference=(
            _interference_from(r, o["interference"], f"{path}.interference")
            if "interference" in o
            else None
        ),
    )


def _framework_to(path: FrameworkPath) -> dict[str, Any]:
    out: dict[str, Any] = {
        "version": FRAMEWORK_VERSIONS[-1],
        "backend": path.backend,
        "alpha_us": _num_out(path.alpha_us),
        "beta_us_per_byte": _num_out(path.beta_us_per_byte),
    }
    if path.interference is not None:
        out["interference"] = _interference_to(path.interference)
    return out


INTERFERENCE_VERSIONS = (1,)
_FRACTION = _Range(MAX_COMPUTE_LOSS, "the largest compute loss the model allows")
_STRETCH = _Range(1e3, "communication a thousand times slower beside compute")


def _interference_from(r: _Reader, v: Any, path: str) -> Interference:
    """``comm.interference`` (optional, versioned; docs/trace-format.md)."""
    o = r.obj(v, path)
    version = r.int_(r.req(o, "version", path), f"{path}.version", minimum=1)
    if version not in INTERFERENCE_VERSIONS:
        raise r.err(f"{path}.version", f"version {version} is not supported (known: 1)")
    samples = []
    if "samples" in o:
        field = f"{path}.samples"
        for i, pt in enumerate(r.count(r.list_(o["samples"], field), field)):
            if not isinstance(pt, list) or len(pt) != 2:
                raise r.err(f"{field}[{i}]", f"must be a [bytes, loss] pair, got {_show(pt)}")
            samples.append(
                (
                    r.bytes_(pt[0], f"{field}[{i}][0]", minimum=0),
                    r.num(pt[1], f"{field}[{i}][1]", bound=_Range(1.0, "all of it")),
                )
            )

    def num(key: str, bound: _Range) -> float:
        return r.num(o[key], f"{path}.{key}", bound=bound) if key in o else 0.0

    return Interference(
        us_per_byte=num("us_per_byte", _BETA),
        us_per_call=num("us_per_call", _US),
        idle_loss=num("idle_loss", _FRACTION),
        comm_stretch=num("comm_stretch", _STRETCH),
        comm_us_per_call=num("comm_us_per_call", _US),
        samples=tuple(samples),
    )


def framework_from_dict(obj: Any, *, where: str = "") -> FrameworkPath:
    """A ``comm.framework`` object (also in ``comm.json``), checked as a trace's is."""
    return _framework_from(_Reader(where), obj, "framework")


def framework_to_dict(path: FrameworkPath) -> dict[str, Any]:
    """The ``comm.framework`` object of ``path``."""
    return _framework_to(path)


def interference_from_dict(obj: Any, *, where: str = "") -> Interference:
    """A ``comm.interference`` object (also in ``comm.json``), checked as a trace's is."""
    return _interference_from(_Reader(where), obj, "interference")


def interference_to_dict(term: Interference) -> dict[str, Any]:
    """The ``comm.interference`` object of ``term``."""
    return _interference_to(term)


def _interference_to(term: Interference) -> dict[str, Any]:
    out: dict[str, Any] = {
        "version": INTERFERENCE_VERSIONS[-1],
        "us_per_byte": _num_out(term.us_per_byte),
        "us_per_call": _num_out(term.us_per_call),
        "idle_loss": _num_out(term.idle_loss),
        "comm_stretch": _num_out(term.comm_stretch),
        "comm_us_per_call": _num_out(term.comm_us_per_call),
    }
    if term.samples:
        out["samples"] = [[int(b), _num_out(x)] for b, x in term.samples]
    return out


def trace_from_dict(obj: Any, *, where: str = "") -> Trace:
    """Parse a trace-format-v1 object (types and ranges only; see ``pace.verify`` for the rest)."""
    r = _Reader(where)
    top = r.obj(obj, "(top level)")
    r.header(top, TRACE_FORMAT, SUPPORTED_TRACE_VERSIONS)
    model = r.str_(top["model"], "model", nonempty=False) if "model" in top else ""
    meta = r.obj(top["meta"], "meta") if "meta" in top else {}
    return Trace(
        model=model,
        ops=r.items(top, "ops", "", lambda v, p: _op_from(r, v, p)),
        tensors=r.items(top, "tensors", "", lambda v, p: _tensor_from(r, v, p)),
        comm=_comm_from(r, r.req(top, "comm", ""), "comm"),
        meta=meta,
    )


def _num_out(x: float) -> float | int:
    # Integral values are written as JSON integers: shorter, and what a human writes by hand.
    return int(x) if float(x).is_integer() and abs(x) < 2**53 else float(x)


def _comm_to(comm: CommModel, *, with_samples: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "workers": comm.workers,
        "algorithm": comm.algorithm,
        "alpha_us": _num_out(comm.alpha_us),
        "beta_us_per_byte": _num_out(comm.beta_us_per_byte),
    }
    if with_samples and comm.samples:
        out["samples"] = [[int(b), _num_out(us)] for b, us in comm.samples]
    if comm.interference is not None:
        out["interference"] = _interference_to(comm.interference)
    if comm.update_us_per_byte > 0:  # optional: files without it keep their bytes
        out["update_us_per_byte"] = _num_out(comm.update_us_per_byte)
    if comm.copy_us_per_byte > 0:
        out["copy_us_per_byte"] = _num_out(comm.copy_us_per_byte)
    if comm.framework is not None:
        out["framework"] = _framework_to(comm.framework)
    if comm.batched_alpha_us is not None:  # optional, as above
        out["batched_alpha_us"] = _num_out(comm.batched_alpha_us)
    return out


def trace_to_dict(trace: Trace) -> dict[str, Any]:
    """The trace-format-v1 object of ``trace`` (``bytes`` for ``size_bytes``)."""
    return {
        "format": TRACE_FORMAT,
        "version": SUPPORTED_TRACE_VERSIONS[-1],
        "model": trace.model,
        "meta": dict(trace.meta),
        "ops": [
            {
                "name": op.name,
                "phase": op.phase,
                "duration_us": _num_out(op.duration_us),
                "deps": list(op.deps),
            }
            for op in trace.ops
        ],
        "tensors": [
            {
                "name": t.name,
                "bytes": t.size_bytes,
                "producer": t.producer,
                "consumers": list(t.consumers),
                # Written only when known, so traces without it round-trip unchanged.
                **({"element_bytes": t.element_bytes} if t.element_bytes != 1 else {}),
                **({"dtype": t.dtype} if t.dtype else {}),
            }
            for t in trace.tensors
        ],
        "comm": _comm_to(trace.comm),
    }


def load_trace(path: PathLike, *, verify: bool = True) -> Trace:
    """Load and (by default) verify the trace in ``path`` (``.json`` or ``.json.gz``).

    Raises ``InputError`` naming the file and the field for any malformed or inconsistent input.
    """
    where = str(path)
    trace = trace_from_dict(load_json(path), where=where)
    if verify:
        from pace.verify import verify_trace

        verify_trace(trace, where=where)
    return trace


def save_trace(trace: Trace, path: PathLike) -> None:
    """Write ``trace`` to ``path``; gzip-compressed if the name ends in ``.gz``."""
    _dump(trace_to_dict(trace), path)


# ---------------------------------------------------------------------------------------------
# Schedule


def _slice_from(r: _Reader, v: Any, path: str) -> Slice:
    o = r.obj(v, path)
    return Slice(
        tensor=r.str_(r.req(o, "tensor", path), f"{path}.tensor"),
        offset_bytes=r.bytes_(r.req(o, "offset", path), f"{path}.offset", minimum=0),
        size_bytes=r.bytes_(r.req(o, "bytes", path), f"{path}.bytes", minimum=1),
    )


def _unit_from(r: _Reader, v: Any, path: str) -> Unit:
    o = r.obj(v, path)
    priority = r.num(r.req(o, "priority", path), f"{path}.priority", nonneg=False)
    slices = r.items(o, "slices", path, lambda s, p: _slice_from(r, s, p))
    if not slices:
        raise r.err(f"{path}.slices", "must not be empty (a unit carries at least one slice)")
    return Unit(priority=priority, slices=slices)


def schedule_from_dict(obj: Any, *, where: str = "") -> Schedule:
    """Parse a schedule-format-v1 object (types and ranges; coverage is ``verify_schedule``)."""
    r = _Reader(where)
    top = r.obj(obj, "(top level)")
    r.header(top, SCHEDULE_FORMAT, SUPPORTED_SCHEDULE_VERSIONS)
    meta = dict(r.obj(top["meta"], "meta")) if "meta" in top else {}
    speedup = None
    if "compute_speedup" in meta:
        # The one key of meta with a meaning, a typed field in memory: replays re-apply it.
        speedup = check_compute_speedup(
            meta.pop("compute_speedup"), where=where, field="meta.compute_speedup"
        )
    mode = top.get("mode", "overlap")
    if mode not in SCHEDULE_MODES:
        raise r.err("mode", f"must be one of {', '.join(SCHEDULE_MODES)}, got {_show(mode)}")
    framework = top.get("framework")
    if framework is not None and framework not in FRAMEWORK_BACKENDS:
        raise r.err(
            "framework",
            f"must be one of {', '.join(FRAMEWORK_BACKENDS)} (or absent), got {_show(framework)}",
        )
    in_order = top.get("in_order", False)
    if not isinstance(in_order, bool):
        raise r.err("in_order", f"must be true or false (or absent), got {_show(in_order)}")
    units = r.items(top, "units", "", lambda v, p: _unit_from(r, v, p))
    n_slices = sum(len(u.slices) for u in units)
    if n_slices > MAX_SLICES:
        raise r.err("units", f"carry {n_slices} slices in all, at most {MAX_SLICES} are allowed")
    return Schedule(
        mode=mode,
        trace_digest=r.str_(r.req(top, "trace_digest", ""), "trace_digest"),
        cost_model=_comm_from(r, r.req(top, "cost_model", ""), "cost_model"),
        units=units,
        predicted_iteration_us=r.num(
            r.req(top, "predicted_iteration_us", ""), "predicted_iteration_us"
        ),
        compute_speedup=speedup,
        framework=framework,
        in_order=in_order,
        meta=meta,
    )


def check_compute_speedup(value: Any, *, where: str = "", field: str = "") -> float:
    """``value`` as a compute speed-up in ``[MIN_COMPUTE_SPEEDUP, MAX_COMPUTE_SPEEDUP]``.

    Used for ``--compute-speedup`` (``where`` the option) and a schedule's
    ``meta.compute_speedup`` (``where`` the file), so each error names what the user gave.
    """
    if not is_number(value):
        raise InputError(f"must be a number, got {_show(value)}", where=where, field=field)
    x = float(value)
    if not (MIN_COMPUTE_SPEEDUP <= x <= MAX_COMPUTE_SPEEDUP):
        raise InputError(
            f"must be a number in [{MIN_COMPUTE_SPEEDUP:g}, {MAX_COMPUTE_SPEEDUP:g}] (from 1000x "
            f"slower to a million times faster than profiled), got {_show(value)}",
            where=where,
            field=field,
        )
    return x


def schedule_to_dict(schedule: Schedule) -> dict[str, Any]:
    """The schedule-format-v1 object of ``schedule``."""
    out: dict[str, Any] = {
        "format": SCHEDULE_FORMAT,
        "version": SUPPORTED_SCHEDULE_VERSIONS[-1],
        "trace_digest": schedule.trace_digest,
        "cost_model": _comm_to(schedule.cost_model),
        "predicted_iteration_us": _num_out(schedule.predicted_iteration_us),
        "units": [
            {
                "priority": _num_out(u.priority),
                "slices": [
                    {"tensor": s.tensor, "offset": s.offset_bytes, "bytes": s.size_bytes}
                    for s in u.slices
                ],
            }
            for u in schedule.units
        ],
    }
    if schedule.mode != "overlap":
        # Absent means "overlap": files written before the field existed keep their meaning.
        out["mode"] = schedule.mode
    if schedule.framework is not None:
        # Absent means "replay the units", as in every file before the field existed.
        out["framework"] = schedule.framework
    if schedule.in_order:
        # Absent means the contract's replay, as in every file before the field existed.
        out["in_order"] = True
    meta = dict(schedule.meta)
    if schedule.compute_speedup is not None:
        meta["compute_speedup"] = _num_out(schedule.compute_speedup)
    if meta:
        out["meta"] = meta
    return out


def load_schedule(path: PathLike, *, trace: Trace | None = None) -> Schedule:
    """Load the schedule in ``path``; with ``trace``, also verify it belongs to and covers it.

    Raises ``InputError`` (``ScheduleMismatchError`` for a digest mismatch) naming file and field.
    """
    where = str(path)
    schedule = schedule_from_dict(load_json(path), where=where)
    if trace is not None:
        from pace.verify import verify_schedule

        verify_schedule(schedule, trace, where=where)
    return schedule


def save_schedule(schedule: Schedule, path: PathLike) -> None:
    """Write ``schedule`` to ``path``; gzip-compressed if the name ends in ``.gz``."""
    _dump(schedule_to_dict(schedule), path)
