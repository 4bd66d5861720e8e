"""Old paths of lvfl modules whose code lives elsewhere, and the import hook that keeps those paths loading.

Configs name classes by `class_path`, checkpoints record the class paths of the run that wrote them (the fingerprint
of `lvfl.runs`), and pickles record each object's module: all three outlive a module that moves. `MOVED` is the one
table of such moves, old dotted path -> the module that holds that code:

- `install()` appends `OldPathFinder` to `sys.meta_path`. Standing last, it is asked only about a module that no
  file provides, that is an old path, and answers it with the module at the new path itself: one module object under
  both names, so a class keeps one identity (`isinstance`, pickling) whichever path named it. Nothing is imported
  until an old path is asked for. A package whose modules moved calls `install()` when it is imported
  (`lvfl.privacy`), which every import of one of its old paths runs first.
- `current_path(path)` rewrites a recorded `module.Name` under an old module to the module that holds it, so that a
  class path recorded before a move compares equal to the one recorded after it.

An old path that names a package (`lvfl.privacy.soft_labels`, the soft-label channels' package and the old path of
their module `channels`) is answered by that package, which re-exports that module's names; its row here serves
`current_path`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED", "OldPathFinder", "current_path", "install"]

#: old module path -> the module that holds its code
MOVED: dict[str, str] = {
    "lvfl.privacy.base": "lvfl.privacy.aggregation.base",
    "lvfl.privacy.plain": "lvfl.privacy.aggregation.plain",
    "lvfl.privacy.masking": "lvfl.privacy.aggregation.masking",
    "lvfl.privacy.paillier": "lvfl.privacy.aggregation.paillier",
    "lvfl.privacy.ckks": "lvfl.privacy.aggregation.ckks",
    "lvfl.privacy.label_dp": "lvfl.privacy.labels.mechanisms",
    "lvfl.privacy.label_release": "lvfl.privacy.labels.release",
    "lvfl.privacy.soft_labels": "lvfl.privacy.soft_labels.channels",
    "lvfl.privacy.paillier_soft_labels": "lvfl.privacy.soft_labels.paillier",
    "lvfl.privacy.gradient_defenses": "lvfl.privacy.defenses.gradients",
    "lvfl.privacy.embedding_defenses": "lvfl.privacy.defenses.embeddings",
}


def current_path(path: str) -> str:
    """`path` (`module.Name`) with its module's new path if the module moved, else `path` unchanged.

    Example:
        >>> current_path("lvfl.privacy.masking.DHMasking")
        'lvfl.privacy.aggregation.masking.DHMasking'
        >>> current_path("lvfl.privacy.DHMasking")
        'lvfl.privacy.DHMasking'
    """
    module, _, name = path.rpartition(".")
    new = MOVED.get(module)
    return f"{new}.{name}" if new is not None else path


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new path, which is imported (once) under its own name."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system has just set the old path's spec on the module: it keeps its own (its real name)
        module.__spec__ = self._spec


class OldPathFinder(importlib.abc.MetaPathFinder):
    """Finds each old path of `MOVED` as an alias of its new module (see the module docstring)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec that loads `fullname` as its new module if `MOVED` names it; None for any other module."""
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Append `OldPathFinder` to `sys.meta_path`, once per process."""
    if not any(isinstance(finder, OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(OldPathFinder())
