"""Hostile inputs end to end: task archives, URLs, workspace.yaml, git arguments, the request.

These checks happen in the service itself, not in the sandbox, so each runs once, under the
best runtime this host has; each ends with an ordinary evaluation that passes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tarfile
import uuid
import zipfile
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from evaluations import lifecycle
from evaluations.models import Evaluation, Status
from evaluations.runtime import probe_bwrap
from tests.helpers.archives import tar_member, write_lying_zip_bomb, write_tar, write_zip, zip_member
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.runtimes import run_evaluation
from tests.helpers.tasks import SOLVER
from tests.security.support import evaluate, still_works

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def runtime_name():
    works, detail = probe_bwrap()
    if not works and os.environ.get("REQUIRE_SANDBOX") == "1":
        pytest.fail(f"REQUIRE_SANDBOX=1 but bubblewrap does not work here: {detail}")
    return "bwrap" if works else "none"


def refused(tasks, config, runtime_name, url, *, step="downloading_task") -> str:
    evaluation = evaluate(url, SOLVER, config=config, sandbox=runtime_name)
    assert evaluation.status == "failed", (evaluation.status, evaluation.error)
    assert evaluation.error.startswith(f"{step}: "), evaluation.error
    assert evaluation.test_results.count() == 0 and evaluation.agent_output == ""
    return evaluation.error


def valid_task_members(tasks) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """The members of a real, valid task (repository served beside it), under task/."""
    repo_url, shas = tasks.repo([{"calc.py": "def add(a, b):\n    return a - b\n"}])
    files = {
        "task/workspace.yaml": f"repo: {repo_url}\nbase_commit: {shas[0]}\n".encode(),
        "task/prompt.md": b"Make add() add.\n",
        "task/tests/fail_to_pass_add.sh": b"python3 -c 'from calc import add; assert add(2, 3) == 5'\n",
    }
    return [(tar_member("task", tarfile.DIRTYPE), None), *((tar_member(n), d) for n, d in files.items())]


def serve_tar(tasks, members) -> str:
    name = f"hostile-{uuid.uuid4().hex[:8]}.tar.gz"
    write_tar(tasks.www / name, members)
    return f"{tasks.base_url}/{name}"


def serve_zip(tasks, entries) -> str:
    name = f"hostile-{uuid.uuid4().hex[:8]}.zip"
    write_zip(tasks.www / name, entries)
    return f"{tasks.base_url}/{name}"


# -- archives -----------------------------------------------------------------


def test_zip_slip(tasks, e2e_config, runtime_name):
    token = uuid.uuid4().hex[:10]
    entries = [(zip_member(m.name + ("/" if m.isdir() else ""), is_dir=m.isdir()), d or b"")
               for m, d in valid_task_members(tasks)]  # fmt: skip
    entries.append((zip_member(f"task/../../../../../../tmp/te-slip-{token}"), b"owned"))
    error = refused(tasks, e2e_config, runtime_name, serve_zip(tasks, entries))
    assert ".." in error and not Path(f"/tmp/te-slip-{token}").exists()
    still_works(tasks, e2e_config, runtime_name)


def test_tar_with_dot_dot(tasks, e2e_config, runtime_name):
    token = uuid.uuid4().hex[:10]
    members = [*valid_task_members(tasks), (tar_member(f"task/../../../../../tmp/te-slip-{token}"), b"owned")]
    error = refused(tasks, e2e_config, runtime_name, serve_tar(tasks, members))
    assert ".." in error and not Path(f"/tmp/te-slip-{token}").exists()
    still_works(tasks, e2e_config, runtime_name)


def test_tar_with_an_absolute_path(tasks, e2e_config, runtime_name):
    token = uuid.uuid4().hex[:10]
    members = [*valid_task_members(tasks), (tar_member(f"/tmp/te-abs-{token}"), b"owned")]
    assert "absolute name" in refused(tasks, e2e_config, runtime_name, serve_tar(tasks, members))
    assert not Path(f"/tmp/te-abs-{token}").exists()
    still_works(tasks, e2e_config, runtime_name)


def test_tar_symlink_then_a_file_through_it(tasks, e2e_config, runtime_name, canary):
    members = [
        *valid_task_members(tasks),
        (tar_member("task/escape", tarfile.SYMTYPE, linkname=str(canary)), None),
        (tar_member("task/escape/planted"), b"owned"),
    ]
    assert "is a symbolic link" in refused(tasks, e2e_config, runtime_name, serve_tar(tasks, members))
    assert sorted(p.name for p in canary.iterdir()) == ["file"]
    still_works(tasks, e2e_config, runtime_name)


def test_tar_hard_link_out(tasks, e2e_config, runtime_name, canary):
    members = [
        *valid_task_members(tasks),
        (tar_member("task/tests/hard", tarfile.LNKTYPE, linkname=str(canary / "file")), None),
    ]
    assert "is a hard link" in refused(tasks, e2e_config, runtime_name, serve_tar(tasks, members))
    assert (canary / "file").read_text() == "canary\n" and os.stat(canary / "file").st_nlink == 1
    still_works(tasks, e2e_config, runtime_name)


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE], ids=["char", "block", "fifo"])
def test_tar_device_or_fifo_member(tasks, e2e_config, runtime_name, kind):
    members = [*valid_task_members(tasks), (tar_member("task/tests/dev", kind), None)]
    assert "only files and folders are allowed" in refused(tasks, e2e_config, runtime_name, serve_tar(tasks, members))
    still_works(tasks, e2e_config, runtime_name)


def test_hundred_thousand_members(tasks, e2e_config, runtime_name):
    name = f"many-{uuid.uuid4().hex[:8]}.zip"
    with zipfile.ZipFile(tasks.www / name, "w", zipfile.ZIP_STORED) as zf:
        for i in range(100_000):
            zf.writestr(zipfile.ZipInfo(f"task/f{i}"), b"")
    error = refused(tasks, e2e_config, runtime_name, f"{tasks.base_url}/{name}")
    assert "more than 10000 members" in error
    still_works(tasks, e2e_config, runtime_name)


def test_zip_bomb(tasks, e2e_config, runtime_name):
    # 64 MiB of zeros (about 64 KiB compressed) against a 16 MiB cap on extracted bytes.
    config = dataclasses.replace(e2e_config, max_extracted_bytes=16 * 1024 * 1024)
    url = serve_zip(tasks, [(zip_member("task/bomb.bin"), b"\0" * (64 * 1024 * 1024))])
    assert "would extract to more than 16777216 bytes" in refused(tasks, config, runtime_name, url)
    still_works(tasks, e2e_config, runtime_name)


def test_zip_bomb_that_lies_about_its_size(tasks, e2e_config, runtime_name):
    config = dataclasses.replace(e2e_config, max_extracted_bytes=16 * 1024 * 1024)
    name = f"liar-{uuid.uuid4().hex[:8]}.zip"
    write_lying_zip_bomb(tasks.www / name, real_size=64 * 1024 * 1024, declared_size=1024, name="task/bomb.bin")
    # Read only as far as the declared size: the data does not match its checksum there.
    error = refused(tasks, config, runtime_name, f"{tasks.base_url}/{name}")
    assert "corrupt" in error or "more than 16777216 bytes" in error, error
    still_works(tasks, e2e_config, runtime_name)


# -- URLs -----------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.2", "::1"])
def test_task_url_on_a_refused_loopback_address(tasks, e2e_config, runtime_name, host):
    # Only 127.0.0.1 is allowed; the same task served on another loopback address is refused
    # before any connection is made.
    with TestHTTPServer(tasks.www, host=host) as other:
        url = tasks.task().replace(tasks.base_url, other.url("").rstrip("/"))
        assert "loopback" in refused(tasks, e2e_config, runtime_name, url)
        assert other.requests == []
    still_works(tasks, e2e_config, runtime_name)


def test_redirect_to_a_refused_address(tasks, e2e_config, runtime_name, http_server):
    with TestHTTPServer(tasks.www, host="127.0.0.2") as other:
        target = tasks.task().replace(tasks.base_url, other.url("").rstrip("/"))
        http_server.redirect("/hop", target)
        error = refused(tasks, e2e_config, runtime_name, f"{tasks.base_url}/hop")
        assert "127.0.0.2" in error and "loopback" in error
        assert other.requests == []
    still_works(tasks, e2e_config, runtime_name)


def test_file_url_for_etc_passwd(tasks, e2e_config, runtime_name, api):
    response = api.post(
        "/evaluate",
        data=json.dumps({"agent_code": SOLVER, "task_url": "file:///etc/passwd"}),
        content_type="application/json",
    )
    assert response.status_code == 400 and "task_url" in response.json()["fields"]
    error = refused(tasks, e2e_config, runtime_name, "file:///etc/passwd")  # had it got in anyway
    assert "scheme" in error and "root:" not in error
    still_works(tasks, e2e_config, runtime_name)


# -- git and workspace.yaml ----------------------------------------------------------


def _workspace_task(tasks, yaml: str) -> str:
    return tasks.task(workspace=yaml)


def test_repository_url_with_the_ext_transport(tasks, e2e_config, runtime_name):
    token = uuid.uuid4().hex[:10]
    url = _workspace_task(tasks, f"repo: 'ext::sh -c touch% /tmp/te-ext-{token}'\nbase_commit: abc123\n")
    assert "ext::" in refused(tasks, e2e_config, runtime_name, url)
    assert not Path(f"/tmp/te-ext-{token}").exists()
    still_works(tasks, e2e_config, runtime_name)


def test_repository_on_a_refused_address(tasks, e2e_config, runtime_name):
    url = _workspace_task(tasks, "repo: http://127.0.0.2:9/r.git\nbase_commit: abc123\n")
    assert "loopback" in refused(tasks, e2e_config, runtime_name, url, step="cloning_repo")
    still_works(tasks, e2e_config, runtime_name)


def test_base_commit_that_is_a_git_option(tasks, e2e_config, runtime_name):
    token = uuid.uuid4().hex[:10]
    repo_url, _ = tasks.repo([{"calc.py": "x = 1\n"}])
    yaml = f"repo: {repo_url}\nbase_commit: '--upload-pack=touch /tmp/te-up-{token}'\n"
    error = refused(tasks, e2e_config, runtime_name, _workspace_task(tasks, yaml), step="downloading_task")
    assert "base_commit" in error and not Path(f"/tmp/te-up-{token}").exists()
    still_works(tasks, e2e_config, runtime_name)


def test_yaml_python_object(tasks, e2e_config, runtime_name):
    token = uuid.uuid4().hex[:10]
    yaml = f"repo: !!python/object/apply:os.system ['touch /tmp/te-yaml-{token}']\nbase_commit: abc\n"
    assert "!!python/object/apply:os.system" in refused(tasks, e2e_config, runtime_name, _workspace_task(tasks, yaml))
    assert not Path(f"/tmp/te-yaml-{token}").exists()
    still_works(tasks, e2e_config, runtime_name)


def test_yaml_alias_bomb(tasks, e2e_config, runtime_name):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    yaml = "\n".join(lines) + "\nrepo: https://example.com/r.git\nbase_commit: abc\ninstall: *i\n"
    assert "expands to more than" in refused(tasks, e2e_config, runtime_name, _workspace_task(tasks, yaml))
    still_works(tasks, e2e_config, runtime_name)


# -- the request ------------------------------------------------------------------


def test_agent_code_of_the_maximum_size_plus_one(tasks, e2e_config, runtime_name, api, executor_config):
    executor_config(max_agent_code_bytes=4096)

    def post(code: str):
        body = {"agent_code": code, "task_url": tasks.task()}
        return api.post("/evaluate", data=json.dumps(body), content_type="application/json")

    too_big = post(SOLVER + "#" * (4096 - len(SOLVER.encode()) + 1))
    assert too_big.status_code == 400 and "agent_code" in too_big.json()["fields"]
    at_limit = post(SOLVER + "#" * (4096 - len(SOLVER.encode())))
    assert at_limit.status_code == 202
    eval_id = at_limit.json()["eval_id"]  # the service still works: the admitted one passes
    assert lifecycle.record(eval_id, status=Status.RUNNING, expect=[Status.PENDING])
    run_evaluation(eval_id, e2e_config, runtime_name)
    assert Evaluation.objects.get(id=eval_id).passed is True


# -- what a task's texts may hold (MAX_PROMPT_BYTES, MAX_TESTS) ----------------------------------
# Each task names a repository on a refused address: were the texts let through, the evaluation
# would fail later, at cloning_repo, with them already stored.

UNREACHABLE_REPO = "repo: http://127.0.0.2:9/r.git\nbase_commit: abc123\n"
MAX_TESTS_SENTENCE = "over the cap of 1000 tests (MAX_TESTS: tests/*.sh scripts and checks.txt commands together)"


def _nothing_stored(error: str, eval_id) -> None:
    row = Evaluation.objects.get(id=eval_id)
    assert row.error_kind == "task_invalid", (row.error_kind, error)
    assert (row.task_prompt, row.original_pr) == ("", "")


@pytest.mark.parametrize(
    ("files", "sentence"),
    [
        (
            {"original_pr.md": "x" * (262144 + 1)},
            "downloading_task: original_pr.md is larger than 262144 bytes (MAX_PROMPT_BYTES)",
        ),
        (
            {"prompt.md": "x" * (128 * 1024)},
            "downloading_task: prompt.md is larger than 131071 bytes (the most an agent's --instruction "
            "argument holds; MAX_PROMPT_BYTES is 262144)",
        ),
    ],
    ids=["original_pr.md", "prompt.md"],
)
def test_a_task_text_over_its_cap_is_refused_and_not_stored(tasks, e2e_config, runtime_name, files, sentence):
    evaluation = evaluate(tasks.task(workspace=UNREACHABLE_REPO, extra=files), SOLVER, config=e2e_config,
                          sandbox=runtime_name)  # fmt: skip
    assert (evaluation.status, evaluation.error) == ("failed", sentence)
    _nothing_stored(evaluation.error, evaluation.id)
    still_works(tasks, e2e_config, runtime_name)


def test_a_smaller_max_prompt_bytes_holds_every_task_text(tasks, e2e_config, runtime_name):
    config = dataclasses.replace(e2e_config, max_prompt_bytes=64)
    url = tasks.task(workspace=UNREACHABLE_REPO, extra={"prompt.md": "p" * 65})
    error = refused(tasks, config, runtime_name, url)
    assert error == "downloading_task: prompt.md is larger than 64 bytes (MAX_PROMPT_BYTES)"
    url = tasks.task(workspace=UNREACHABLE_REPO, extra={"original_pr.md": "o" * 64, "prompt.md": "p" * 64})
    assert refused(tasks, config, runtime_name, url, step="cloning_repo")  # at the cap: both kept
    row = Evaluation.objects.order_by("-created_at").first()
    assert (row.task_prompt, row.original_pr) == ("p" * 64, "o" * 64)


def test_three_hundred_thousand_checks_are_refused_at_the_first_past_the_cap(tasks, e2e_config, runtime_name):
    checks = "# one command a line\n" + "true\n" * 300_000
    evaluation = evaluate(tasks.task(workspace=UNREACHABLE_REPO, checks=checks), SOLVER, config=e2e_config,
                          sandbox=runtime_name)  # fmt: skip
    # The task's own test script is test 1: the 1000th command of checks.txt (its line 1001) is test 1001.
    assert evaluation.error == f"downloading_task: checks.txt line 1001 is test 1001, {MAX_TESTS_SENTENCE}"
    assert evaluation.test_results.count() == 0
    _nothing_stored(evaluation.error, evaluation.id)
    still_works(tasks, e2e_config, runtime_name)


def test_too_many_test_scripts_are_refused_before_one_is_read(tasks, e2e_config, runtime_name):
    scripts = {f"pass_to_pass_{i:04d}.sh": "true\n" for i in range(1001)}
    evaluation = evaluate(tasks.task(workspace=UNREACHABLE_REPO, tests=scripts), SOLVER, config=e2e_config,
                          sandbox=runtime_name)  # fmt: skip
    assert evaluation.error == f"downloading_task: tests/pass_to_pass_1000.sh is test 1001, {MAX_TESTS_SENTENCE}"
    assert evaluation.test_results.count() == 0
    _nothing_stored(evaluation.error, evaluation.id)
    still_works(tasks, e2e_config, runtime_name)


BIG_TEXT_COLUMNS = ("task_prompt", "original_pr", "agent_output", "agent_patch", "test_output", "log")


def test_stored_texts_are_written_once_and_never_again_by_status_writes(tasks, e2e_config, runtime_name):
    """Every later write of the row (each step, each status, the end) names only its own columns:
    a large text stored at downloading_task is not carried again by the six writes after it."""
    url = tasks.task(extra={"original_pr.md": "the upstream fix\n" * 1000})
    with CaptureQueriesContext(connection) as queries:
        evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox=runtime_name)
    assert (evaluation.status, evaluation.passed) == ("completed", True), evaluation.error
    assert evaluation.original_pr == "the upstream fix\n" * 1000
    updates = [q["sql"] for q in queries.captured_queries
               if q["sql"].lstrip().upper().startswith("UPDATE") and "evaluations_evaluation" in q["sql"]]  # fmt: skip
    assert len(updates) > 8  # the steps' and statuses' writes were seen
    for column in BIG_TEXT_COLUMNS:
        writes = [sql for sql in updates if f'"{column}" =' in sql]
        assert len(writes) == 1, (column, [sql[:200] for sql in writes])
