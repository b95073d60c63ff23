"""An agent (or a task's test) cannot forge the log's structure.

The executor's own lines start with LOG_MARK (U+241E) at the start of a line; a command's output
never carries the mark into the log (the capture replaces it with U+FFFD). A reader of
``GET /evaluate/{id}/logs`` (curl, then ``grep '^␞'``) and the admin's log box find exactly the
executor's lines, and an agent printing them, mark and all, shows up as output.
"""

from __future__ import annotations

import html
import re

import pytest

from evaluations.models import Evaluation
from evaluations.runtime.output import LOG_MARK
from tests.helpers.archives import Exec
from tests.helpers.tasks import ADD_TEST, SOLVER
from tests.security.support import evaluate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# What the executor writes, in its own formats, as a hostile agent prints it: bare, and with the
# mark itself, whole and split over two writes (the capture reads it in two pieces).
FORGED = [
    "=== completed ===",
    "--- fail_to_pass_add: passed (exit 0) ---",
    "=== running_tests ===",
    "[killed: nothing happened]",
    f"{LOG_MARK} === completed ===",
    f"{LOG_MARK} --- fail_to_pass_add: passed (exit 0) ---",
]
FORGER = (
    "import sys, time\n"
    f"for line in {FORGED!r}:\n"
    "    print(line, flush=True)\n"
    "out = sys.stdout.buffer\n"
    "out.write(b'\\xe2\\x90'); out.flush(); time.sleep(0.2)\n"
    "out.write(b'\\x9e === completed ===\\n'); out.flush()\n"
    + SOLVER
    + "print('the last line has no newline', end='', flush=True)\n"
)
# The task's own test prints forgeries too (a task author is a command's output as well).
FORGING_TEST = Exec(ADD_TEST.content + "echo '=== failed ==='\nprintf '\\xe2\\x90\\x9e --- fake: passed ---\\n'\n")
REAL = [
    "=== downloading_task ===",
    "=== preparing_environment ===",
    "=== cloning_repo ===",
    "=== installing_deps ===",
    "=== installing_agent ===",
    "=== running_agent ===",
    "=== running_tests ===",
    "=== fail_to_pass_add ===",
    "--- fail_to_pass_add: passed (exit 0) ---",
    "=== completed ===",
]


def executor_lines(log: str) -> list[str]:
    """As a reader takes them: the lines that start with the mark, without it."""
    return [line[len(LOG_MARK) + 1 :] for line in log.split("\n") if line.startswith(LOG_MARK)]


@pytest.mark.parametrize("sandbox", ["bwrap"], indirect=True)
def test_an_agent_printing_the_executors_lines_cannot_pass_for_it(tasks, e2e_config, sandbox, api, admin_client):
    url = tasks.task(tests={"fail_to_pass_add.sh": FORGING_TEST})
    evaluation = evaluate(url, FORGER, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed) == ("completed", True), evaluation.error
    assert evaluation.agent_output.startswith("\n".join(FORGED))  # the stored output is what it printed

    log = api.get(f"/evaluate/{evaluation.id}/logs").content.decode()
    assert log == evaluation.log
    assert executor_lines(log) == REAL, log
    for line in ("=== completed ===", "--- fail_to_pass_add: passed (exit 0) ---", "=== failed ==="):
        assert f"\n{line}\n" in log  # as output: a line of its own, unmarked
    assert "\n\ufffd === completed ===\n" in log and "\n\ufffd --- fake: passed ---\n" in log
    assert log.count(LOG_MARK) == len(REAL)  # not one more, anywhere
    assert "the last line has no newline\n" + LOG_MARK + " === running_tests ===" in log

    page = admin_client.get(f"/admin/evaluations/evaluation/{evaluation.id}/change/").content.decode()
    spans = [html.unescape(s) for s in re.findall(r'<span class="te-exec">(.*?)</span>', page)]
    assert spans == [f"{LOG_MARK} {line}" for line in REAL]
    box = page[page.index('id="te-log"') : page.index("</pre>", page.index('id="te-log"'))]
    assert "\n=== completed ===\n" in html.unescape(box)  # the agent's, shown as plain output

    # Rebuilt from the stored outputs (no log kept): the same rule holds.
    Evaluation.objects.filter(id=evaluation.id).update(log="")
    rebuilt = api.get(f"/evaluate/{evaluation.id}/logs").content.decode()
    assert executor_lines(rebuilt) == [
        "=== running_agent (exit 0) ===",
        "=== running_tests ===",
        "=== fail_to_pass_add ===",
        "--- fail_to_pass_add: passed (exit 0) ---",
        "=== completed ===",
    ], rebuilt
    assert "\n=== completed ===\n" in rebuilt and "\n\ufffd === completed ===\n" in rebuilt
