"""Test ids or shell commands? How a row's FAIL_TO_PASS says which it is (SPEC §22).

SWE-bench's ``FAIL_TO_PASS`` holds test ids that its parsers read from a log; SWE-Forge's holds shell
commands the task runs. Which one a row is follows from its entries alone, never from the row's other
fields (SWE-bench Verified carries ``difficulty`` too; SWE-bench 5.0 carries ``image``...).

An entry is a **test id** when any of these holds, tried in this order:

1. pytest's node id: its first blank-free run holds ``::`` (``tests/t.py::test_a``,
   ``t.py::C::test[2 + 3]``, ``t.py::test[it's "x"]``, ``t.py::test[a``: parameters may hold blanks,
   brackets, quotes and shell characters; SWE-bench's cut ids keep an open bracket);
2. Django's ``name (dotted.module.Class)`` (``test_x (admin_views.tests.AdminViewTest)``);
3. one word with no shell character (``test_add``, SymPy's; ``tests/test_x.py``).

Else it is a **shell command** when its first word (after ``NAME=value`` assignments), or that word's
last path part, is a program tests are run with (``COMMAND_WORDS``: ``python``, ``pytest``, ``go``,
``cargo``, ``npm``, ``bash``, ``cd``, ``make``...), or it starts with ``./`` or ``/`` (a script), or it
joins commands (``&&``, ``||``, `` | ``, ``$(``). Anything else is a test id: a Django
docstring line (``Regression for #20509``) or a JavaScript id (``src/a.test.ts > renders``) is prose,
not a program.

A row is SWE-Forge's only when every FAIL_TO_PASS entry is a command: one test id among them (a
Django docstring line that starts like a command, ``make sure ...``, beside real ids) makes them ids.
"""

from __future__ import annotations

import posixpath
import re

IDS, COMMANDS = "ids", "commands"

COMMAND_WORDS = frozenset(
    """
    python python2 python3 pytest py.test tox nox uv uvx poetry pipenv hatch pdm coverage
    go cargo rustc npm npx yarn pnpm node bun deno jest vitest mocha tsc
    bash sh zsh dash env timeout xvfb-run cd
    make cmake ctest ninja meson mvn mvnw gradle gradlew java javac sbt lein dotnet
    ruby bundle rake rspec php composer phpunit swift perl prove lua julia Rscript mix elixir
    stack cabal dune zig
    """.split()
)
_PYTEST_ID = re.compile(r"\S*::\S*.*", re.S)
_DJANGO_ID = re.compile(r"[^\s()]+ \([A-Za-z_][\w.]*\)")
_ONE_WORD = re.compile(r"[\w.:/\[\]@+,=-]+")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=\S*")
_JOINERS = ("&&", "||", " | ", "$(")


def is_command(entry: str) -> bool:
    """Whether ``entry`` (one FAIL_TO_PASS / PASS_TO_PASS item) is a shell command rather than a test id."""
    text = entry.strip()
    first = text.split(None, 1)[0] if text else ""
    if "::" in first or _DJANGO_ID.fullmatch(text):
        return False
    if _ONE_WORD.fullmatch(text) and not text.startswith(("./", "/")):
        return text in COMMAND_WORDS  # a bare `pytest` or `make` is a command; `test_add` an id
    words = text.split()
    while words and _ASSIGNMENT.fullmatch(words[0]):
        words.pop(0)
    if not words:
        return False
    program = words[0]
    if program in COMMAND_WORDS or posixpath.basename(program) in COMMAND_WORDS:
        return True
    if program.startswith(("./", "/")):
        return True
    return any(joiner in text for joiner in _JOINERS)


def kind_of(entries: list[str]) -> str:
    """COMMANDS when every entry is a shell command, else IDS."""
    return COMMANDS if entries and all(is_command(entry) for entry in entries) else IDS
