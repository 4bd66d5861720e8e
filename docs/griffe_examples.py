"""A griffe extension for the API pages: lvfl's docstrings head their doctests `Example:` (STYLE: "runnable
`Example:` blocks"); griffe's Google parser reads only `Examples:` as an examples section and would render the
`>>>` lines as prose. This renames the heading when the docstring is loaded, so the examples render as code.
It changes nothing in the package; mkdocs.yml loads it (`extensions:`) and excludes it from the site.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_HEADING = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Read a Google-style `Example:` heading as `Examples:`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rename the heading in the object's docstring, if it has one."""
        if obj.docstring is not None and "Example:" in obj.docstring.value:
            obj.docstring.value = _HEADING.sub(r"\1Examples:", obj.docstring.value)
