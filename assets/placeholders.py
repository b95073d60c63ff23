"""``{{static:NAME}}`` placeholders (SPEC section 6).

1. One pass with ``re.sub``: every placeholder of the text is replaced, and
   what was inserted is never scanned again (a path that itself reads
   ``{{static:x}}`` stays as it is).
2. Names are matched exactly (case and all); a placeholder naming no asset
   raises ``PlaceholderError("unknown static asset placeholder: NAME")``, the
   first one met. ``{{static:}}`` is such an error too (an empty name), and
   so is ``{{static: x}}`` (the name is `` x``).
3. Only the exact, lower-case ``{{static:`` opens a placeholder:
   ``{{STATIC:x}}`` or ``{{ static:x }}`` is ordinary text, left untouched.
4. The value is inserted as it is, not shell-quoted: write ``"{{static:x}}"``
   in a command if a save_path may hold spaces.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from assets.model import AssetError

PLACEHOLDER = re.compile(r"\{\{static:([^{}]*)\}\}")


class PlaceholderError(AssetError):
    """A placeholder names no asset."""


def substitute(text: str, paths: Mapping[str, str]) -> str:
    """``text`` with every ``{{static:NAME}}`` replaced by ``paths[NAME]``."""

    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name not in paths:
            raise PlaceholderError(f"unknown static asset placeholder: {name}" if name else _EMPTY)
        return paths[name]

    return PLACEHOLDER.sub(replace, text)


_EMPTY = "unknown static asset placeholder: {{static:}} has an empty name"
