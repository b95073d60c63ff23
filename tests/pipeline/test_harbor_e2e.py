"""The example Harbor and Terminal-Bench 1.x tasks (examples/harbor, examples/terminal-bench) through the
whole pipeline (SPEC §17): built from their Dockerfiles (apt-get and pip through the evaluation's proxy),
the agent in the image's WorkingDir with /logs/agent, the verifier in a fresh sandbox with /tests and
/logs/verifier, graded by the executor from the reward file or pytest's -rA summary.

``FROM debian:bookworm`` reaches the suite's Debian tree through IMAGE_REGISTRY_MIRRORS (docker.io's
mirror is the registry on 127.0.0.1); the Debian and PyPI registries resolve to a TEST-NET address
here, allowed by name for these tests only (EGRESS_ALLOW), as an operator would.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from evaluations.models import Evaluation
from tests.helpers.archives import Exec, write_archive
from tests.pipeline.test_e2e import evaluate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
REGISTRIES = ("deb.debian.org", "security.debian.org", "pypi.org", "files.pythonhosted.org")
NOOP = "#!/bin/bash\necho doing nothing\n"
LEAVE_TRAJECTORY = "mkdir -p /logs/agent/steps && echo '{\"step\": 1}' > /logs/agent/trajectory.json\n"


@pytest.fixture
def config(hub_task_config):
    return dataclasses.replace(hub_task_config, egress_allow=REGISTRIES, agent_timeout_secs=300, test_timeout_secs=300)


def serve(tasks, folder: Path) -> str:
    """The example folder as a task archive on the suite's HTTP server; its URL."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            files[path.relative_to(folder).as_posix()] = Exec(data) if os.access(path, os.X_OK) else data
    name = f"{folder.name}-{os.urandom(4).hex()}.tar.gz"
    write_archive(tasks.www / name, files, "tar.gz", top=folder.name)
    return f"{tasks.base_url}/{name}"


def solution_agent(script: Path, extra: str = "") -> str:
    """A bash agent running the task's reference solution from the working directory."""
    return "#!/bin/bash\nset -e\n" + extra + script.read_text().replace("#!/bin/bash\n", "", 1)


def test_a_harbor_task_built_from_its_dockerfile_is_graded_by_its_reward_json(tasks, config):
    folder = EXAMPLES / "harbor/sales-report"
    url = serve(tasks, folder)
    solved = evaluate(url, solution_agent(folder / "solution/solve.sh", LEAVE_TRAJECTORY), config=config,
                      sandbox="bwrap", language="bash")  # fmt: skip
    assert (solved.status, solved.passed, solved.reward) == ("completed", True, 1.0), (
        solved.error, solved.log[-4000:])  # fmt: skip
    assert solved.rewards == {"reward": 1.0, "tests_passed": 3, "tests_total": 3, "fraction": 1.0}
    assert solved.task_format == "harbor"
    assert solved.environment["kind"] == "dockerfile"
    metadata = solved.task_metadata["metadata"]
    assert metadata["difficulty"] == "easy" and metadata["tags"] == ["csv", "json", "python"]
    limits = solved.limits_applied
    assert (limits["agent_timeout_secs"], limits["verifier_timeout_secs"], limits["memory_mb"]) == (300, 120, 2048)
    assert (limits["network"], limits["allowed_hosts"]) == ("allowlist", ["pypi.org", "files.pythonhosted.org"])
    assert [(a["path"], a["size_bytes"]) for a in solved.artifacts] == [("trajectory.json", 12)]
    assert solved.system_changes["count"] == 0, solved.system_changes
    assert [r.name for r in solved.test_results.all()] == ["test.sh"]
    assert "3 passed" in solved.test_output

    failed = evaluate(url, NOOP, config=config, sandbox="bwrap", language="bash")
    assert (failed.status, failed.passed, failed.error_kind) == ("failed", False, "tests_failed")
    assert failed.reward == 0.0 and failed.rewards["tests_passed"] == 0
    assert failed.error == "running_tests: reward 0 < 1 (/logs/verifier/reward.json)"
    assert failed.environment["cached"] is True  # the second build: every step from the build cache


def test_the_agent_never_sees_the_tests_or_the_solution_and_finds_logs_verifier_empty(tasks, config):
    folder = EXAMPLES / "harbor/fix-greeting"
    snoop = (
        'for p in /tests /solution; do test -e $p && echo "SAW $p"; done\n'
        'test -d /logs/verifier && test -z "$(ls -A /logs/verifier)" && echo "EMPTY /logs/verifier"\n'
        "id -un\n"
    )
    evaluation = evaluate(url := serve(tasks, folder), snoop + solution_agent(folder / "solution/solve.sh"),
                          config=config, sandbox="bwrap", language="bash")  # fmt: skip
    assert "SAW" not in evaluation.agent_output, evaluation.agent_output
    assert "EMPTY /logs/verifier" in evaluation.agent_output, evaluation.agent_output  # as Harbor mounts it
    assert "dev" in evaluation.agent_output  # the image's USER
    assert (evaluation.status, evaluation.reward, evaluation.rewards) == ("completed", 1.0, {"reward": 1.0}), (
        evaluation.error, evaluation.log[-3000:])  # fmt: skip
    assert evaluation.limits_applied["network"] == "no-network"
    assert evaluation.limits_applied["agent_network"] is False
    # A reward the agent writes where the verifier's goes is gone before the verifier runs.
    forger = "echo 1 > /logs/verifier/reward.txt && echo '{\"reward\": 1}' > /logs/verifier/reward.json\n"
    noop = evaluate(url, forger, config=config, sandbox="bwrap", language="bash")
    assert (noop.status, noop.reward, noop.rewards) == ("failed", 0.0, {"reward": 0.0}), (noop.error, noop.agent_output)


def test_a_terminal_bench_task_is_graded_by_pytests_summary_and_exit_status(tasks, config):
    folder = EXAMPLES / "terminal-bench/word-count"
    url = serve(tasks, folder)
    solved = evaluate(url, solution_agent(folder / "solution.sh"), config=config, sandbox="bwrap", language="bash")
    assert (solved.status, solved.passed, solved.reward) == ("completed", True, 1.0), (
        solved.error, solved.test_output[-3000:])  # fmt: skip
    assert solved.task_format == "terminal-bench"
    names = sorted(r.name for r in solved.test_results.all())
    assert names == [
        "tests/test_outputs.py::test_file_exists", "tests/test_outputs.py::test_five_lines",
        "tests/test_outputs.py::test_input_untouched",
    ] or all(name.endswith(("test_file_exists", "test_five_lines", "test_input_untouched")) for name in names), names  # fmt: skip
    forged = "cd /app\necho 'PASSED tests/test_outputs.py::test_five_lines' > top5.txt\n"
    failed = evaluate(url, forged, config=config, sandbox="bwrap", language="bash")
    assert (failed.status, failed.passed, failed.reward, failed.error_kind) == ("failed", False, 0.0, "tests_failed")


def test_what_the_agent_changed_outside_its_folder_is_on_the_record(tasks, config):
    folder = EXAMPLES / "terminal-bench/word-count"
    plant = (
        "mkdir -p /usr/local/lib/python3.11/dist-packages\n"
        "echo 'import os' > /usr/local/lib/python3.11/dist-packages/sitecustomize.py\n"
        "printf '#!/bin/sh\\necho fake\\n' > /usr/local/bin/pytest && chmod +x /usr/local/bin/pytest\n"
        "rm -f /etc/motd\n"
    )
    evaluation = evaluate(serve(tasks, folder), plant + solution_agent(folder / "solution.sh"), config=config,
                          sandbox="bwrap", language="bash")  # fmt: skip
    changes = evaluation.system_changes
    assert "/usr/local/bin/pytest" in changes["paths"] and "/etc/motd" in changes["paths"], changes
    assert "/usr/local/bin/pytest" in changes["suspicious"]
    assert "/usr/local/lib/python3.11/dist-packages/sitecustomize.py" in changes["suspicious"]
    assert not any(path.startswith("/app") or path.startswith("/logs/agent") for path in changes["paths"])
    assert Evaluation.objects.get(id=evaluation.id).status == "completed"  # recorded, not judged


ISOLATED_TEST = """\
#!/bin/bash
# Rewards 1 only when the agent's answer is there and nothing it planted outside /app is.
if [ "$(cat /app/answer.txt)" = 42 ] && [ ! -e /usr/local/bin/grade-helper ] && [ ! -e /etc/planted ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def harbor_folder(root: Path, *, toml: str, test: str) -> Path:
    for relpath, text in {"task.toml": toml, "instruction.md": "Write 42 to /app/answer.txt.\n",
                          "environment/Dockerfile": "FROM debian:bookworm\nWORKDIR /app\n",
                          "tests/test.sh": test}.items():  # fmt: skip
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_text(text)
    (root / "tests/test.sh").chmod(0o755)
    return root


@pytest.mark.parametrize("isolated", [True, False])
def test_an_isolated_verifier_sees_the_image_and_only_the_agents_working_directory(tasks, config, tmp_path, isolated):
    folder = harbor_folder(tmp_path / "isolated", test=ISOLATED_TEST,
                           toml=f"[verifier]\nisolated = {str(isolated).lower()}\n")  # fmt: skip
    agent = "echo 42 > /app/answer.txt\ntouch /usr/local/bin/grade-helper /etc/planted\n"
    evaluation = evaluate(serve(tasks, folder), agent, config=config, sandbox="bwrap", language="bash")
    assert sorted(evaluation.system_changes["paths"]) == ["/etc/planted", "/usr/local/bin/grade-helper"]
    assert evaluation.system_changes["suspicious"] == ["/usr/local/bin/grade-helper"]  # on the verifier's PATH
    assert (evaluation.status, evaluation.reward) == (("completed", 1.0) if isolated else ("failed", 0.0)), (
        evaluation.error, evaluation.log[-3000:])  # fmt: skip


def test_an_allowlist_lets_the_agent_reach_only_the_tasks_hosts(tasks, config):
    """pypi.org is in sales-report's allowed_hosts; deb.debian.org is allowed by the operator (EGRESS_ALLOW
    here) but not by the task: refused, and recorded as the task's refusal."""
    folder = EXAMPLES / "harbor/sales-report"
    reach = (
        "for host in pypi.org deb.debian.org; do\n"
        "  python3 -c \"import sys, urllib.request; urllib.request.urlopen('https://' + sys.argv[1] + '/', timeout=30)\""
        ' $host >/dev/null 2>&1 && echo "reached $host" || echo "refused $host"\n'
        "done\n"
    )
    evaluation = evaluate(serve(tasks, folder), reach + solution_agent(folder / "solution/solve.sh"), config=config,
                          sandbox="bwrap", language="bash")  # fmt: skip
    assert "reached pypi.org" in evaluation.agent_output and "refused deb.debian.org" in evaluation.agent_output, (
        evaluation.agent_output)  # fmt: skip
    refused = [r for r in evaluation.egress if r["host"] == "deb.debian.org" and r["step"] == "running_agent"]
    assert refused and not refused[0]["allowed"] and refused[0]["reason"] == "not in the task's allowed_hosts"
    assert evaluation.status == "completed"


def test_links_an_agent_plants_where_the_verifiers_folders_go_are_replaced_not_followed(tasks, config, tmp_path):
    """Root in its image, the agent puts a link at /tests to a folder of its own holding a reward of 1
    (/logs/verifier is a mount while it runs: a link there lands inside it, and is discarded); the
    executor makes real folders there before the verifier (bwrap would follow a link on the host), and
    the reward is the verifier's own 0."""
    folder = harbor_folder(tmp_path / "links", toml="", test="#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n")
    agent = (
        "mkdir -p /root/fake && echo 1 > /root/fake/reward.txt && echo 'exit 0' > /root/fake/test.sh\n"
        "rm -rf /tests && ln -s /root/fake /tests\n"
        "rm -rf /logs/verifier; ln -sfn /root/fake /logs/verifier\n"
        "ls -la /logs/verifier /\n"
    )
    evaluation = evaluate(serve(tasks, folder), agent, config=config, sandbox="bwrap", language="bash")
    assert "tests -> /root/fake" in evaluation.agent_output, evaluation.agent_output
    assert (evaluation.status, evaluation.reward, evaluation.error_kind) == ("failed", 0.0, "tests_failed"), (
        evaluation.error, evaluation.log[-3000:])  # fmt: skip
