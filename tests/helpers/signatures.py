"""Signed documents for the tests (SPEC §18): a field changed by one value, the README's verify snippet."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys

from tests.helpers.service import PROJECT


def tampered(document: dict, field: str) -> dict:
    """``document`` with ``field`` changed by the smallest step its type allows."""
    changed = copy.deepcopy(document)
    changed[field] = _changed(changed[field])
    assert changed[field] != document[field] or type(changed[field]) is not type(document[field])
    return changed


def _changed(value):
    if value is None:
        return "x"
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value[:-1] + ("0" if value[-1:] != "0" else "1")  # one byte
    if isinstance(value, list):
        if not value:
            return [{}]
        return [_changed(value[0]), *value[1:]]
    if isinstance(value, dict):
        if not value:
            return {"x": 1}
        first = sorted(value)[0]
        return {**value, first: _changed(value[first])}
    raise TypeError(f"no change for {type(value).__name__}")


def readme_snippet() -> str:
    """The README's "Signed results" Python snippet, as written."""
    readme = (PROJECT / "README.md").read_text()
    section = readme.split("## Signed results", 1)[1].split("\n## ", 1)[0]
    (snippet,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return snippet


def readme_verify(documents: list[dict], executor_url: str) -> list[bool]:
    """The README snippet's ``verify`` on each document, run in a Python of its own, as a platform would."""
    driver = "\nimport sys\nprint(json.dumps([verify(d, sys.argv[1]) for d in json.load(sys.stdin)]))\n"
    run = subprocess.run(
        [sys.executable, "-c", readme_snippet() + driver, executor_url],
        input=json.dumps(documents),
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)
