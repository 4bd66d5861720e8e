"""The package's layering, read from the source: no import circle, the layer contract, crypto at the bottom.

The import graph is built from every `import` statement of every module of `lvfl` (function-local ones included,
`if TYPE_CHECKING:` blocks excluded): `A -> B` when A names module B, and, when B is a submodule of a package that A
is not part of, also `A -> package` (importing `lvfl.privacy.aggregation.base` first runs `lvfl/privacy/__init__.py`).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import layer_contract
import networkx as nx
import pytest
from helpers import REPO

LVFL = REPO / "lvfl"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(LVFL.rglob("*.py"))}


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imported_modules(name: str, path: Path) -> set[str]:
    """The lvfl modules `name` imports, each as the module that runs (a name bound from a package is the package)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in MODULES else base)
    found: set[str] = set()
    for target in targets:
        if target not in MODULES:
            continue
        found.add(target)
        parent = target.rpartition(".")[0]
        while parent and not (name == parent or name.startswith(parent + ".")):
            found.add(parent)  # the package's __init__ runs first
            parent = parent.rpartition(".")[0]
    found.discard(name)
    return found


def import_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for name, path in MODULES.items():
        graph.add_node(name)
        graph.add_edges_from((name, target) for target in imported_modules(name, path))
    return graph


@pytest.mark.slow
def test_the_graph_sees_real_imports():
    graph = import_graph()
    assert graph.has_edge("lvfl.protocols.easter", "lvfl.protocols.base")
    assert graph.has_edge("lvfl.privacy.aggregation.paillier", "lvfl.crypto.paillier")
    assert graph.has_edge("lvfl.privacy.aggregation.paillier", "lvfl.crypto")  # the package's __init__ runs first
    assert not graph.has_edge("lvfl.crypto.paillier", "lvfl.crypto")  # a module inside the package: no edge


@pytest.mark.slow
def test_no_import_circle_anywhere_in_lvfl():
    cycles = list(nx.simple_cycles(import_graph()))
    assert not cycles, "import circles: " + "; ".join(" -> ".join([*c, c[0]]) for c in cycles[:10])


@pytest.mark.slow
def test_crypto_imports_nothing_else_from_lvfl():
    graph = import_graph()
    for name in (n for n in graph if n == "lvfl.crypto" or n.startswith("lvfl.crypto.")):
        outside = {t for t in graph.successors(name) if not (t == "lvfl.crypto" or t.startswith("lvfl.crypto."))}
        assert not outside, f"{name} imports {sorted(outside)}"


@pytest.mark.slow
def test_modular_arithmetic_lives_in_crypto():
    """No `powmod` outside lvfl/crypto, and only lvfl/crypto imports gmpy2 (or phe's own arithmetic)."""
    for name, path in MODULES.items():
        if name.startswith("lvfl.crypto"):
            continue
        text = path.read_text()
        assert "powmod" not in text, name
        tree = ast.parse(text)
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {m for m in names if m.split(".")[0] == "gmpy2" or m == "phe.util"}, name


def test_protocols_check_capabilities_not_backend_classes():
    for name, path in MODULES.items():
        if name.startswith("lvfl.protocols"):
            assert not re.search(r"isinstance\([^)]*\b(Plain|DHMasking|Paillier|CKKS)\b", path.read_text()), name


# ------------------------------------------------------------------------------------------------- the layer contract
def contract_violations(root: Path) -> subprocess.CompletedProcess:
    """tests/layer_contract.py on the `lvfl` package under `root`, in a process of its own (that `lvfl`, not ours)."""
    return subprocess.run(
        [sys.executable, str(REPO / "tests" / "layer_contract.py")],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_layer_contract_holds():
    """Every import of the package, lazy ones included, goes down the layers of docs/design.md."""
    assert layer_contract.violations() == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "wrong_import", "refusal"),
    [
        ("wire.py", "from lvfl.commands.fit import build_cli", "lvfl.wire -> lvfl.commands.fit (wire stands below"),
        ("crypto/keys.py", "from lvfl.privacy import Plain", "lvfl.crypto.keys -> lvfl.privacy (crypto stands below"),
        ("loggers.py", "from lvfl.network import DEVICE", "(loggers and network share a layer of lvfl)"),
        ("commands/errors.py", "from lvfl.commands.fit import main", "(errors stands below fit in lvfl.commands)"),
    ],
)
def test_the_layer_contract_refuses_an_import_up_even_inside_a_function(tmp_path, module, wrong_import, refusal):
    """A copy of the package given one import up a layer, inside a function: the check fails and names the import."""
    shutil.copytree(LVFL, tmp_path / "lvfl", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "lvfl" / module
    target.write_text(target.read_text() + f"\n\ndef _reaches_up():\n    {wrong_import}\n")
    result = contract_violations(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert refusal in result.stdout
    assert f"lvfl/{module}:" in result.stdout
    assert wrong_import in result.stdout


@pytest.mark.slow
def test_the_layer_contract_places_every_package(tmp_path):
    """A new package that stands on no layer is refused until it is placed."""
    shutil.copytree(LVFL, tmp_path / "lvfl", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "lvfl" / "scheduling").mkdir()
    (tmp_path / "lvfl" / "scheduling" / "__init__.py").write_text('"""A package on no layer yet."""\n')
    result = contract_violations(tmp_path)
    assert result.returncode == 1
    assert "lvfl.scheduling stands on no layer of lvfl" in result.stdout
