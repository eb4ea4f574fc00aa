"""No import cycle inside pace, between modules or between packages (docs/design.md, "Who may
import whom").

Every import of a pace module is read from the source with ``ast``: at module level and inside
functions (a lazy import still makes two modules depend on each other; it only hides the cycle
from the interpreter until the wrong call order breaks it), under ``if TYPE_CHECKING:`` too,
relative imports resolved, and the names ``importlib.import_module`` is given as string literals
(the CLI's subcommand list). ``from pace.x import y`` imports the submodule ``pace.x.y`` when
there is one, else ``pace.x`` itself, i.e. its ``__init__``; a package's ``__init__`` that
imports its own submodules is an edge like any other, so a submodule that imports its package's
``__init__`` closes a cycle.

Two graphs must be acyclic: modules, and packages (``pace.sim``, ``pace.lp``, ... and each
top-level module as itself), the latter without self-edges. A failure prints the shortest cycles
with the file and line of each import.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
# Cycles printed in a failure message, shortest first, and the longest one looked for.
_SHOWN = 8
_MAX_CYCLE_LENGTH = 8


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    path: Path
    line: int


def modules(root: Path, package: str) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file of ``package`` (a directory under ``root``)."""
    out: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_package(name: str, known: dict[str, Path]) -> bool:
    return name in known and known[name].name == "__init__.py"


def _resolve(module: str, level: int, name: str | None, known: dict[str, Path]) -> str:
    """The absolute name of ``from <level dots><name> import ...`` written in ``module``."""
    if level == 0:
        return name or ""
    package = module if _is_package(module, known) else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{name}" if name else package


def imports(root: Path, package: str) -> Iterator[Import]:
    """Every import of a module of ``package`` by a module of ``package``."""
    known = modules(root, package)

    def ours(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        dynamic = any(
            isinstance(node, ast.Attribute) and node.attr == "import_module"
            for node in ast.walk(tree)
        )
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if ours(alias.name):
                        yield Import(module, alias.name, path, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, node.level, node.module, known)
                if not ours(base):
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    target = sub if sub in known else base
                    yield Import(module, target, path, node.lineno)
            elif (
                dynamic
                and isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and "." in node.value
                and node.value in known
                and node.value != module
            ):
                yield Import(module, node.value, path, node.lineno)


def package_of(module: str, known: dict[str, Path]) -> str:
    """``pace.sim.core`` -> ``pace.sim``; a top-level module (``pace.io``) is its own."""
    parts = module.split(".")
    if len(parts) >= 2 and _is_package(".".join(parts[:2]), known):
        return ".".join(parts[:2])
    return module


def module_graph(root: Path, package: str) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(modules(root, package))
    for imp in imports(root, package):
        if imp.source == imp.target:
            continue
        if not g.has_edge(imp.source, imp.target):
            g.add_edge(imp.source, imp.target, where=[])
        g.edges[imp.source, imp.target]["where"].append(_where(imp, root))
    return g


def package_graph(root: Path, package: str) -> nx.DiGraph:
    known = modules(root, package)
    g = nx.DiGraph()
    g.add_nodes_from({package_of(m, known) for m in known})
    for imp in imports(root, package):
        a, b = package_of(imp.source, known), package_of(imp.target, known)
        if a == b:
            continue
        if not g.has_edge(a, b):
            g.add_edge(a, b, where=[])
        g.edges[a, b]["where"].append(_where(imp, root))
    return g


def _where(imp: Import, root: Path) -> str:
    return f"{imp.path.relative_to(root)}:{imp.line}"


def cycles(g: nx.DiGraph) -> list[list[str]]:
    """The shortest simple cycles (up to ``_SHOWN``), each starting at its smallest name."""
    found = itertools.islice(nx.simple_cycles(g, length_bound=_MAX_CYCLE_LENGTH), 10_000)
    rotated = []
    for c in found:
        i = c.index(min(c))
        rotated.append(c[i:] + c[:i])
    rotated.sort(key=lambda c: (len(c), c))
    if not rotated and not nx.is_directed_acyclic_graph(g):
        # Only cycles longer than the bound: one will do.
        rotated = [[u for u, _ in nx.find_cycle(g)]]
    return rotated[:_SHOWN]


def describe(g: nx.DiGraph, found: list[list[str]]) -> str:
    lines = []
    for c in found:
        steps = []
        for a, b in itertools.pairwise([*c, c[0]]):
            where = g.edges[a, b]["where"]
            more = f" +{len(where) - 1}" if len(where) > 1 else ""
            steps.append(f"{a} -> {b} ({where[0]}{more})")
        lines.append("  " + ";  ".join(steps))
    total = sum(1 for _ in itertools.islice(nx.simple_cycles(g), 1000))
    head = f"{total if total < 1000 else '1000+'} import cycle(s); the shortest:"
    return "\n".join([head, *lines])


def test_no_module_import_cycle() -> None:
    g = module_graph(ROOT, "pace")
    assert "pace.io" in g
    assert "pace.cli" in g
    found = cycles(g)
    assert not found, describe(g, found)


def test_no_package_import_cycle() -> None:
    g = package_graph(ROOT, "pace")
    assert {"pace.sim", "pace.lp", "pace.cli", "pace.io"} <= set(g)
    found = cycles(g)
    assert not found, describe(g, found)


# ---------------------------------------------------------------------------------------------
# The checker itself


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_detects_a_cycle_of_two_modules(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import g\n\ndef f():\n    return g()\n",
            # Lazily, and relative: still an edge.
            "pkg/b.py": "def g():\n    from .a import f\n    return f\n",
            "pkg/c.py": "import pkg.a\n",
        },
    )
    g = module_graph(root, "pkg")
    assert set(g.edges) == {("pkg.a", "pkg.b"), ("pkg.b", "pkg.a"), ("pkg.c", "pkg.a")}
    found = cycles(g)
    assert found == [["pkg.a", "pkg.b"]]
    text = describe(g, found)
    assert "pkg.a -> pkg.b (pkg/a.py:1)" in text
    assert "pkg.b -> pkg.a (pkg/b.py:2)" in text
    with pytest.raises(AssertionError, match="import cycle"):
        assert not found, text


def test_submodule_importing_its_package_init_is_a_cycle(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.sub.x import f\n",
            "pkg/sub/__init__.py": "from . import x\n",
            # ``from pkg.sub import f`` is the package's __init__, which imports x.
            "pkg/sub/x.py": "def f():\n    from pkg.sub import x\n    from .. import sub\n",
        },
    )
    g = module_graph(root, "pkg")
    assert ("pkg.sub", "pkg.sub.x") in g.edges
    # "from pkg.sub import x": x is a submodule, so that is pkg.sub.x itself (a self-edge,
    # dropped); "from .. import sub" is pkg.sub's __init__.
    assert ("pkg.sub.x", "pkg.sub") in g.edges
    assert ["pkg.sub", "pkg.sub.x"] in cycles(g)


def test_package_graph_ignores_imports_inside_a_package(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/io.py": "from pkg.sim import run\n",
            "pkg/sim/__init__.py": "from pkg.sim.core import run\n",
            "pkg/sim/core.py": "def run():\n    from pkg.lp import solve\n",
            "pkg/lp/__init__.py": "from pkg.lp.model import solve\n",
            "pkg/lp/model.py": "from pkg.sim.core import run\nfrom pkg import io\n",
        },
    )
    g = package_graph(root, "pkg")
    assert set(g) == {"pkg", "pkg.io", "pkg.sim", "pkg.lp"}
    assert ("pkg.sim", "pkg.sim") not in g.edges
    found = cycles(g)
    assert ["pkg.io", "pkg.sim", "pkg.lp"] in found
    assert ["pkg.lp", "pkg.sim"] in found


# The bottom layer (docs/design.md, "Who may import whom", rule 1): what each module may import.
_BASE: dict[str, set[str]] = {
    "pace.options": set(),
    "pace.errors": set(),
    "pace.bounds": set(),
    "pace.ir": {"pace.options"},
    "pace.checks": {"pace.errors"},
    "pace.digest": {"pace.errors", "pace.ir"},
    "pace.verify": {
        "pace.bounds",
        "pace.checks",
        "pace.digest",
        "pace.errors",
        "pace.ir",
        "pace.options",
    },
}


@pytest.mark.parametrize("module", sorted(_BASE))
def test_bottom_layer_imports_only_below_it(module: str) -> None:
    g = module_graph(ROOT, "pace")
    extra = {b: g.edges[module, b]["where"] for b in g.successors(module)} if module in g else {}
    for allowed in _BASE[module]:
        extra.pop(allowed, None)
    assert not extra, f"{module} imports {extra}"
