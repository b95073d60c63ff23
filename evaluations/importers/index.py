"""DIR/index.json and DIR/verification.json of the import commands: merged by id, replaced whole."""

from __future__ import annotations

import json
import os
from pathlib import Path


def merge_index(
    path: Path, entries: list[dict], *, key: str, keep=lambda entry: True, extra: dict | None = None
) -> None:
    """``{"tasks": [...]}``: the file's earlier entries of other ids (``entry[key]``) that ``keep``
    accepts, then ``entries``, sorted by id, and ``extra``'s keys beside ``tasks`` (this import's
    alone); written to a temporary file and renamed over ``path``."""
    try:
        earlier = json.loads(path.read_text(encoding="utf-8")).get("tasks", [])
    except (OSError, ValueError, AttributeError):
        earlier = []
    merged = {e[key]: e for e in earlier if isinstance(e, dict) and isinstance(e.get(key), str)}
    merged = {name: e for name, e in merged.items() if keep(e)}
    merged.update({e[key]: e for e in entries})
    temporary = path.with_name(f".{path.name}.tmp")
    document = {"tasks": [merged[name] for name in sorted(merged)], **(extra or {})}
    temporary.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(temporary, path)
