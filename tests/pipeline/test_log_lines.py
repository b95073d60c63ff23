"""The combined log says what happened, not only what commands printed: each test under its name
with its verdict, a command killed for a limit, the final status; stored head and tail when long."""

from __future__ import annotations

import dataclasses

import pytest

from evaluations import lifecycle
from evaluations.models import Evaluation, Status
from tests.helpers.archives import Exec
from tests.helpers.runtimes import run_evaluation
from tests.helpers.tasks import ADD_TEST, NOOP, SOLVER

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def evaluate(task_url, agent_code, *, config, sandbox, timeout_secs=None) -> Evaluation:
    evaluation = Evaluation.objects.create(task_url=task_url, agent_code=agent_code, timeout_secs=timeout_secs)
    assert lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.PENDING])
    run_evaluation(str(evaluation.id), config, sandbox)
    evaluation.refresh_from_db()
    return evaluation


def test_each_test_is_under_its_name_with_its_verdict_and_the_status_ends_the_log(tasks, e2e_config, sandbox):
    url = tasks.task(
        tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_no.sh": Exec("#!/bin/bash\necho nope\nexit 4\n")}
    )
    log = evaluate(url, SOLVER, config=e2e_config, sandbox=sandbox).log
    tests = log[log.index("␞ === running_tests ===\n") :]
    assert tests == (
        "␞ === running_tests ===\n"
        "␞ === fail_to_pass_add ===\nadd-ok\n␞ --- fail_to_pass_add: passed (exit 0) ---\n"
        "␞ === pass_to_pass_no ===\nnope\n␞ --- pass_to_pass_no: failed (exit 4) ---\n"
        "␞ === failed ===\n␞ running_tests: 1 of 2 tests failed (pass_to_pass_no)\n"
    )


def test_a_command_killed_for_a_limit_says_so_after_its_output(tasks, e2e_config, sandbox):
    agent = "import time\nprint('working', flush=True)\ntime.sleep(60)\n"
    evaluation = evaluate(tasks.task(), agent, timeout_secs=1, config=e2e_config, sandbox=sandbox)
    assert evaluation.status == "cancelled"
    assert evaluation.log.endswith(
        "␞ === running_agent ===\nworking\n␞ [killed: timed out after 1 s]\n"
        "␞ === cancelled ===\n␞ running_agent: agent timed out after 1 s\n"
    )


def test_a_long_log_is_stored_head_and_tail(tasks, e2e_config, sandbox):
    # Each command's live output is capped at MAX_OUTPUT_BYTES; the stored log at four times that.
    config = dataclasses.replace(e2e_config, max_output_bytes=1024)
    noisy = "seq 100000 101000"  # 7 KB
    url = tasks.task(install=[noisy] * 6)
    evaluation = evaluate(url, NOOP, config=config, sandbox=sandbox)
    log = evaluation.log
    assert log.startswith("␞ === downloading_task ===\n")
    assert log.endswith("␞ === failed ===\n␞ running_tests: 1 of 1 tests failed (fail_to_pass_add)\n")
    assert "\n␞ --- fail_to_pass_add: failed (exit 1) ---\n" in log  # the tail: the tests
    marker = log.index(" bytes truncated ...]\n")
    assert log[:marker].rsplit("\n", 1)[1].startswith("␞ [... ")  # the executor's line, on a line of its own
    assert "=== installing_deps ===" in log[:marker]
    assert len(log.encode()) <= 4 * 1024 + 100


def test_bytes_that_are_not_text_are_kept_as_replacement_characters(tasks, e2e_config, sandbox):
    """The kept log goes to the database as its UTF-8 (runtime.output.utf8_text, db/text.py): invalid UTF-8 and
    NUL (which PostgreSQL refuses in text) are U+FFFD there, as in every stored output."""
    raw = b"bad \xff\xe2\x90 nul \x00 ok \xc3\xa9\n"
    agent = f"import sys\nsys.stdout.buffer.write({raw!r})\n"
    evaluation = evaluate(tasks.task(), agent, config=e2e_config, sandbox=sandbox)
    assert "\u241e === running_agent ===\nbad \ufffd\ufffd nul \ufffd ok \u00e9\n\u241e === " in evaluation.log
    assert evaluation.agent_output == "bad \ufffd\ufffd nul \ufffd ok \u00e9\n"
