"""SWE-bench's log parsers (``swebench/harness/log_parsers/python.py``), rewritten: a test log in,
``{test name: status}`` out, the names exactly as SWE-bench reads them, since its published
``FAIL_TO_PASS``/``PASS_TO_PASS`` ids are what these parsers read from its logs.

1. ``pytest`` (``pytest -rA``): a line starting with a status; the name is the word after it, so a
   parametrized id is cut at its first blank (``PASSED t.py::test[a b]`` -> ``t.py::test[a``); on a
   ``FAILED`` line `` - `` (the message's start) is blanked first.
2. ``pytest_options`` (requests, pydicom, pylint): as ``pytest``; a parameter that is an absolute
   path keeps only its last part (``test[/tmp/x/y]`` -> ``test[/y]``): temporary paths differ per run.
3. ``pytest_v2`` (astropy, scikit-learn, sphinx): colours and control characters removed; the name
   is everything after the status (up to `` - `` on a FAILED line), blanks included; lines that
   *end* with a status (``t.py::test PASSED``, older pytest with ``-v``) count too.
4. ``matplotlib``: ``pytest`` with ``MouseButton.LEFT``/``RIGHT`` written 1/3 as older ids have them.
5. ``seaborn``: ``FAILED name``, ``name PASSED ...`` and ``PASSED name``.
6. ``django`` (``./tests/runtests.py --verbosity 2``): ``test_x (module.Class) ... ok`` and the
   ``FAIL``/``ERROR``/``skipped`` endings, ``FAIL: ``/``ERROR: `` headers, and a result printed on a
   line of its own after the test's own output (``ok``), as SWE-bench reads it.
7. ``sympy`` (``bin/test -C --verbose``): ``test_x ok``, ``test_x F``, ``test_x E``, and the
   ``____ path.py:test_x ____`` headers of a failure's traceback.

A pytest ``SKIPPED [2] t.py:5: reason`` summary line names a place, not a test: passed over.

pytest 9's subtests (``unittest``'s ``subTest``, pytest's ``subtests`` fixture): a failing subtest is
``SUBFAILED[msg] t.py::C::test_x`` (``SUBFAIL t.py::C::test_x`` in older pytest-subtests) in the
summary while the test itself is still ``PASSED t.py::C::test_x``. SWE-bench's parsers read the
``PASSED`` line alone; here, in every parser that reads pytest's summary (1. to 5.), a failed subtest
makes its test FAILED whatever else the log says of it (``subtest_failures``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

PASSED, FAILED, SKIPPED, ERROR, XFAIL = "PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"
STATUSES = (FAILED, PASSED, SKIPPED, ERROR, XFAIL)  # SWE-bench's TestStatus, in its order

Parser = Callable[[str], dict[str, str]]

_SKIP_COUNT = re.compile(r"\[\d+\]")
_OPTION = re.compile(r"(.*?)\[(.*)\]")
_COLOUR = re.compile(r"\[(\d+)m")
_CONTROL = str.maketrans("", "", "".join(chr(c) for c in range(1, 32)))
_NODE_START = re.compile(r" ([^\s'\"()\[\]]+::)")  # where a node id starts after a subtest's description


def _status_of(line: str) -> str | None:
    return next((status for status in STATUSES if line.startswith(status)), None)


def _pytest_words(line: str) -> list[str] | None:
    """The words of a status line as ``parse_log_pytest`` splits them; None for any other line."""
    if _status_of(line) is None:
        return None
    if line.startswith(FAILED):
        line = line.replace(" - ", " ")
    words = line.split()
    if len(words) <= 1 or (words[0] == SKIPPED and _SKIP_COUNT.fullmatch(words[1])):
        return None
    return words


def subtest_failures(log: str) -> set[str]:
    """The test ids of the log's ``SUBFAILED[...] ID`` / ``SUBFAIL ID`` lines: tests a subtest of failed."""
    failed = set()
    for line in log.split("\n"):
        test_id = subfailed_id(_COLOUR.sub("", line).translate(_CONTROL).strip())
        if test_id:
            failed.add(test_id)
    return failed


def subfailed_id(line: str) -> str | None:
    """The test id of one summary line ``SUBFAILED[message] (k=v) t.py::C::test_x - Error...`` (pytest 9
    without a description: ``SUBFAILED t.py::...``; pytest-subtests: ``SUBFAIL t.py::...``); None for any
    other line.

    The description (the subTest's message in brackets, its parameters in parentheses, either holding
    blanks and brackets of their own) ends where the node id starts: the first blank-led word holding
    ``::``. The id is what follows, up to the message (``node_id``)."""
    for word in ("SUBFAILED", "SUBFAIL"):
        if line.startswith(word):
            rest = line[len(word) :]
            break
    else:
        return None
    if not rest.startswith((" ", "[")):
        return None
    start = _NODE_START.search(rest)
    if start is None:
        return None
    return node_id(rest[start.start(1) :].strip()) or None


def node_id(rest: str) -> str:
    """The node id of ``rest`` ("<node id> - <message>"): it ends at the first " - " where the id,
    if parametrized (a "[" after its last "::"), has closed its brackets ("test[a - b] - boom")."""
    start = 0
    while (cut := rest.find(" - ", start)) != -1:
        name = rest[:cut]
        if "[" not in name.rpartition("::")[2] or name.endswith("]"):
            return name
        start = cut + 1
    return rest


def _with_subtests(log: str, statuses: dict[str, str]) -> dict[str, str]:
    """``statuses`` with every test a subtest of failed marked FAILED (an id cut at its first blank too)."""
    for test_id in subtest_failures(log):
        statuses[test_id] = FAILED
        cut = test_id.split()[0]
        if cut in statuses:
            statuses[cut] = FAILED
    return statuses


def parse_pytest(log: str) -> dict[str, str]:
    statuses = {}
    for line in log.split("\n"):
        words = _pytest_words(line)
        if words is not None:
            statuses[words[1]] = words[0]
    return _with_subtests(log, statuses)


def parse_pytest_options(log: str) -> dict[str, str]:
    statuses = {}
    for line in log.split("\n"):
        words = _pytest_words(line)
        if words is None:
            continue
        name = words[1]
        option = _OPTION.search(name)
        if option:
            main, parameter = option.groups()
            if parameter.startswith("/") and not parameter.startswith("//") and "*" not in parameter:
                parameter = "/" + parameter.split("/")[-1]
            name = f"{main}[{parameter}]"
        statuses[name] = words[0]
    return _with_subtests(log, statuses)


def parse_pytest_v2(log: str) -> dict[str, str]:
    statuses = {}
    for line in log.split("\n"):
        line = _COLOUR.sub("", line).translate(_CONTROL)
        if _status_of(line) is not None:
            if line.startswith(FAILED):
                line = line.split(" - ", 1)[0]  # the message never enters the name
            words = line.split()
            if len(words) >= 2 and not (words[0] == SKIPPED and _SKIP_COUNT.fullmatch(words[1])):
                statuses[" ".join(words[1:])] = words[0]
        elif any(line.endswith(status) for status in STATUSES):
            words = line.split()
            if len(words) >= 2:
                statuses[" ".join(words[:-1])] = words[-1]
    return _with_subtests(log, statuses)


def parse_matplotlib(log: str) -> dict[str, str]:
    return parse_pytest(log.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3"))


def parse_seaborn(log: str) -> dict[str, str]:
    statuses = {}
    for line in log.split("\n"):
        words = line.split()
        if len(words) < 2:
            continue
        if line.startswith(FAILED):
            statuses[words[1]] = FAILED
        elif f" {PASSED} " in line:
            if words[1] == PASSED:
                statuses[words[0]] = PASSED
        elif line.startswith(PASSED):
            statuses[words[1]] = PASSED
    return _with_subtests(log, statuses)


_DJANGO_PASS_ENDINGS = (" ... ok", " ... OK", " ...  OK")
# A result the runner printed after a long message of the test's own (SWE-bench's three forms).
_DJANGO_INTERRUPTED = (
    re.compile(r"^(.*?)\s\.\.\.\sTesting\ against\ Django\ installed\ in\ ((?s:.*?))\ silenced\)\.\nok$", re.M),
    re.compile(r"^(.*?)\s\.\.\.\sInternal\ Server\ Error:\ \/(.*)\/\nok$", re.M),
    re.compile(r"^(.*?)\s\.\.\.\sSystem check identified no issues \(0 silenced\)\nok$", re.M),
)


def parse_django(log: str) -> dict[str, str]:
    statuses = {}
    previous = None  # the last "name ... " seen: its result may come on a later line
    for line in log.split("\n"):
        line = line.strip()
        if "--version is equivalent to version" in line:
            statuses["--version is equivalent to version"] = PASSED
        if " ... " in line:
            previous = line.split(" ... ")[0]
        for ending in _DJANGO_PASS_ENDINGS:
            if line.endswith(ending):
                if line.startswith("Applying sites.0002_alter_domain_unique...test_no_migrations"):
                    line = line.split("...", 1)[-1].strip()  # django__django-7188's migration output
                statuses[line.rsplit(ending, 1)[0]] = PASSED
                break
        if " ... skipped" in line:
            statuses[line.split(" ... skipped")[0]] = SKIPPED
        if line.endswith(" ... FAIL"):
            statuses[line.split(" ... FAIL")[0]] = FAILED
        if line.startswith("FAIL:"):
            statuses[line.split()[1].strip()] = FAILED
        if line.endswith(" ... ERROR"):
            statuses[line.split(" ... ERROR")[0]] = ERROR
        if line.startswith("ERROR:"):
            statuses[line.split()[1].strip()] = ERROR
        if line.lstrip().startswith("ok") and previous is not None:
            statuses[previous] = PASSED
    for pattern in _DJANGO_INTERRUPTED:
        for match in pattern.finditer(log):
            statuses[match.group(1)] = PASSED
    return statuses


_SYMPY_FAILURE = re.compile(r"(_*) (.*)\.py:(.*) (_*)")


def parse_sympy(log: str) -> dict[str, str]:
    statuses = {f"{m[1]}.py:{m[2]}": FAILED for m in _SYMPY_FAILURE.findall(log)}
    for line in log.split("\n"):
        line = line.strip()
        if not line.startswith("test_"):
            continue
        if line.endswith(" E"):
            statuses[line.split()[0]] = ERROR
        if line.endswith(" F"):
            statuses[line.split()[0]] = FAILED
        if line.endswith(" ok"):
            statuses[line.split()[0]] = PASSED
    return statuses


PARSERS: dict[str, Parser] = {
    "pytest": parse_pytest,
    "pytest_options": parse_pytest_options,
    "pytest_v2": parse_pytest_v2,
    "matplotlib": parse_matplotlib,
    "seaborn": parse_seaborn,
    "django": parse_django,
    "sympy": parse_sympy,
}
DEFAULT_PARSER = "pytest"

# SWE-bench's MAP_REPO_TO_PARSER_PY, by our parser names; any other repository: DEFAULT_PARSER.
REPO_PARSERS = {
    "astropy/astropy": "pytest_v2",
    "django/django": "django",
    "marshmallow-code/marshmallow": "pytest",
    "matplotlib/matplotlib": "matplotlib",
    "mwaskom/seaborn": "seaborn",
    "pallets/flask": "pytest",
    "psf/requests": "pytest_options",
    "pvlib/pvlib-python": "pytest",
    "pydata/xarray": "pytest",
    "pydicom/pydicom": "pytest_options",
    "pylint-dev/astroid": "pytest",
    "pylint-dev/pylint": "pytest_options",
    "pytest-dev/pytest": "pytest",
    "pyvista/pyvista": "pytest",
    "scikit-learn/scikit-learn": "pytest_v2",
    "sqlfluff/sqlfluff": "pytest",
    "sphinx-doc/sphinx": "pytest_v2",
    "sympy/sympy": "sympy",
}


# SWE-bench 5.0's parser names (a row's ``log_parser``, its harness/log_parsers PARSER_REGISTRY) of the
# parsers above; its parsers for other languages are not here, and a row naming one is refused.
LOG_PARSERS = {
    "parse_log_pytest": "pytest",
    "parse_log_pytest_options": "pytest_options",
    "parse_log_pytest_v2": "pytest_v2",
    "parse_log_django": "django",
    "parse_log_seaborn": "seaborn",
    "parse_log_sympy": "sympy",
    "parse_log_matplotlib": "matplotlib",
    **dict.fromkeys(
        (
            "parse_log_astroid",
            "parse_log_flask",
            "parse_log_marshmallow",
            "parse_log_pvlib",
            "parse_log_pyvista",
            "parse_log_sqlfluff",
            "parse_log_xarray",
        ),
        "pytest",
    ),  # fmt: skip
    **dict.fromkeys(("parse_log_pydicom", "parse_log_requests", "parse_log_pylint"), "pytest_options"),
    **dict.fromkeys(("parse_log_astropy", "parse_log_scikit", "parse_log_sphinx"), "pytest_v2"),
}


def parser_for_repo(repo: str) -> str:
    """The parser's name for a SWE-bench row's ``repo`` ("owner/name", any case)."""
    return REPO_PARSERS.get(repo.lower(), DEFAULT_PARSER)
