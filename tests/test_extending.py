"""docs/extending.md is the contract for new models, datamodules, protocols and backends: its examples must run."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


@pytest.mark.slow
def test_every_python_block_of_the_extension_guide_runs_in_order(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) >= 4, "one runnable example per extension point"
    monkeypatch.chdir(tmp_path)  # Lightning writes nothing into the repository
    module = types.ModuleType("extending_guide")  # a real module, so the example classes pickle like a user's
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for i, code in enumerate(blocks):
        exec(compile(code, f"{DOC.name}[block {i}]", "exec"), module.__dict__)  # noqa: S102 - our own documentation
