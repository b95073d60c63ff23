"""SPEC §23 through the whole pipeline, on images pushed to the suite's registry: the image's ENTRYPOINT runs
as the environment's first process before the agent (with Harbor's ``sh -c "sleep infinity"`` as its
arguments), in the image's root, as its user, with ``[environment.env]``; a server it starts on 127.0.0.1 is
reached by the healthcheck, the agent and the verifier; ``[environment.healthcheck]`` must pass first;
nothing of the environment outlives the evaluation (``evaluate`` checks no tagged process is left)."""

from __future__ import annotations

import contextlib
import os
import re
import threading

import pytest

from evaluations.pipeline.cancel import CancelState, Stop
from tests.helpers import images as images_helpers
from tests.helpers.polling import wait_for
from tests.pipeline.test_e2e import evaluate
from tests.pipeline.test_harbor_e2e import harbor_folder, serve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The entrypoint: says who and where it is, waits until the healthcheck has tried twice (a server that
# is slow to come up), then serves /srv/www on 127.0.0.1:80 (a port below 1024, as a container may),
# and execs its arguments as an entrypoint script does.
ENTRY = b"""#!/bin/bash
echo "entry: uid=$(id -u) cwd=$(pwd) greeting=$GREETING args=$*"
(
  until [ -e /srv/state/go ]; do sleep 0.05; done
  exec python3 -m http.server 80 --bind 127.0.0.1 --directory /srv/www
) &
exec "$@"
"""
# Counts its tries in the image's root; lets the server start at the third, healthy once it answers.
CHECK = (
    "n=$(( $(cat /srv/state/tries 2>/dev/null || echo 0) + 1 )); echo $n > /srv/state/tries; "
    "if [ $n -ge 3 ]; then touch /srv/state/go; fi; "
    "python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:80/hello.txt\", timeout=5).read())'"
)
FETCH = (
    "python3 -c 'import urllib.request as u; "
    'print("fetched", u.urlopen("http://127.0.0.1:80/hello.txt", timeout=10).read().decode().strip())\'\n'
)


def pushed(base_image, base_layer, name: str, extra: list, **config) -> str:
    registry, _, _ = base_image
    files = images_helpers.layer(*extra)
    images_helpers.push_image(registry, name, layers=[base_layer, files], config={"Cmd": ["bash"], **config})
    return f"{registry.host}/{name}"


def server_image(base_image, base_layer, name: str) -> str:
    member = images_helpers.member
    extra = [
        member("srv/", type="dir"),
        member("srv/www/", type="dir"),
        member("srv/www/hello.txt", b"hello from the entrypoint\n"),
        member("srv/state/", type="dir", mode=0o777),
        member("usr/local/bin/entry.sh", ENTRY, mode=0o755),
    ]
    return pushed(base_image, base_layer, name, extra, Entrypoint=["/usr/local/bin/entry.sh"],
                  WorkingDir="/srv", Env=[PATH])  # fmt: skip


def test_the_entrypoints_server_is_healthy_then_reached_by_the_agent_and_the_verifier(
    tasks, image_task_config, base_image, base_layer, tmp_path
):
    image = server_image(base_image, base_layer, "health/server:1")
    toml = (
        f'[environment]\ndocker_image = "{image}"\n[environment.env]\nGREETING = "task"\n'
        f"[environment.healthcheck]\ncommand = '''{CHECK}'''\ninterval_sec = 0.1\ntimeout_sec = 30\n"
        "retries = 200\n"
    )
    test = "#!/bin/bash\n" + FETCH + "echo 1 > /logs/verifier/reward.txt\n"
    folder = harbor_folder(tmp_path / "task", toml=toml, test=test)
    agent = FETCH + "echo tries=$(cat /srv/state/tries)\n"
    evaluation = evaluate(serve(tasks, folder), agent, config=image_task_config, sandbox="bwrap", language="bash")
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    assert "fetched hello from the entrypoint" in evaluation.agent_output, evaluation.log[-3000:]
    assert "fetched hello from the entrypoint" in evaluation.test_output
    tries = int(evaluation.agent_output.split("tries=")[1].split()[0])
    assert tries >= 3  # unhealthy twice at least, then healthy: and the agent came after
    # The first process: the image's root and user, WorkingDir, [environment.env], Harbor's arguments; its
    # output kept in the log when it was stopped at the end, still running.
    assert "entry: uid=0 cwd=/srv greeting=task args=sh -c sleep infinity" in evaluation.log
    assert "=== entrypoint (running until the end) ===" in evaluation.log
    assert "healthcheck: healthy" in evaluation.log
    log = evaluation.log
    assert log.index("healthcheck: healthy") < log.index("=== running_agent ===")


def test_an_environment_that_never_becomes_healthy_is_the_tasks_fault(
    tasks, image_task_config, base_image, base_layer, tmp_path
):
    image = server_image(base_image, base_layer, "health/server:2")
    toml = (
        f'[environment]\ndocker_image = "{image}"\n[environment.healthcheck]\n'
        "command = 'echo \"try $(date +%N) not ready\"; exit 3'\ninterval_sec = 0.05\nretries = 3\n"
        "start_period_sec = 0\n"
    )
    folder = harbor_folder(tmp_path / "task", toml=toml, test="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    evaluation = evaluate(serve(tasks, folder), "echo agent-ran\n", config=image_task_config, sandbox="bwrap",
                          language="bash")  # fmt: skip
    assert (evaluation.status, evaluation.error_kind) == ("failed", "task_invalid"), evaluation.error
    assert evaluation.error.startswith("installing_deps: environment never became healthy: "), evaluation.error
    assert "exited 3 3 time(s) in a row: try " in evaluation.error and evaluation.error.endswith(" not ready")
    assert "agent-ran" not in evaluation.agent_output and evaluation.agent_exit_code is None
    # No start period: three checks, each counted (their outputs in the log, one line each)
    assert len(re.findall(r"^try [0-9]+ not ready$", evaluation.log, re.MULTILINE)) == 3, evaluation.log[-3000:]


def test_a_check_over_its_timeout_fails_and_spares_the_entrypoint(
    tasks, image_task_config, base_image, base_layer, tmp_path
):
    """The first check hangs past timeout_sec: killed, counted as a failure (Docker's rule), and the server
    the entrypoint runs is not killed with it: a later check finds it."""
    image = server_image(base_image, base_layer, "health/server:3")
    check = (
        "n=$(( $(cat /srv/state/tries 2>/dev/null || echo 0) + 1 )); echo $n > /srv/state/tries; "
        "if [ $n -eq 1 ]; then touch /srv/state/go; sleep 600; fi; "
        "python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:80/hello.txt\", timeout=5)'"
    )
    toml = (
        f'[environment]\ndocker_image = "{image}"\n[environment.healthcheck]\n'
        f"command = '''{check}'''\ninterval_sec = 0.1\ntimeout_sec = 1\nretries = 200\n"
    )
    test = "#!/bin/bash\n" + FETCH + "echo 1 > /logs/verifier/reward.txt\n"
    folder = harbor_folder(tmp_path / "task", toml=toml, test=test)
    evaluation = evaluate(serve(tasks, folder), FETCH, config=image_task_config, sandbox="bwrap", language="bash")
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    assert "fetched hello from the entrypoint" in evaluation.agent_output


def test_an_entrypoint_that_exits_is_no_error_and_a_compose_command_replaces_harbors(
    tasks, image_task_config, base_image, base_layer, tmp_path
):
    member = images_helpers.member
    image = pushed(base_image, base_layer, "health/exits:1", [member("usr/local/bin/once.sh",
                   b"#!/bin/sh\necho \"once: $*\"\nexit 7\n", mode=0o755)],
                   Entrypoint=["/usr/local/bin/once.sh"], Env=[PATH])  # fmt: skip
    folder = harbor_folder(tmp_path / "task", toml=f'[environment]\ndocker_image = "{image}"\n',
                           test="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")  # fmt: skip
    compose = folder / "environment/docker-compose.yaml"
    compose.write_text("services:\n  main:\n    command: [first, 'second word']\n")
    evaluation = evaluate(serve(tasks, folder), "echo agent-ran\n", config=image_task_config, sandbox="bwrap",
                          language="bash")  # fmt: skip
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    assert "agent-ran" in evaluation.agent_output
    assert "=== entrypoint (exit 7) ===" in evaluation.log and "once: first second word" in evaluation.log


def test_an_image_whose_cmd_is_a_shell_starts_nothing_and_keeps_a_network_of_its_own(
    tasks, image_task_config, base_image, base_layer, tmp_path
):
    """Harbor's docker backend replaces the CMD (``bash`` here) with ``sleep infinity``: nothing to run, no
    hang; without a first process or a healthcheck the sandboxes keep their own network namespaces."""
    image = pushed(base_image, base_layer, "health/plain:1", [], Env=[PATH])
    folder = harbor_folder(tmp_path / "task", toml=f'[environment]\ndocker_image = "{image}"\n',
                           test="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")  # fmt: skip
    agent = "readlink /proc/self/ns/net\n"
    evaluation = evaluate(serve(tasks, folder), agent, config=image_task_config, sandbox="bwrap", language="bash")
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    assert "entrypoint" not in evaluation.log and "healthcheck" not in evaluation.log
    assert evaluation.agent_output.strip().startswith("net:[")
    assert evaluation.agent_output.strip() != os.readlink("/proc/self/ns/net")  # never the host's


def test_a_cancel_ends_the_wait_between_two_checks(tasks, image_task_config, base_image, base_layer, tmp_path):
    """interval_sec = 900: without the cancel the evaluation would wait a quarter of an hour per check."""
    image = server_image(base_image, base_layer, "health/server:4")
    toml = (
        f'[environment]\ndocker_image = "{image}"\n[environment.healthcheck]\n'
        "command = 'echo checked-once; exit 1'\ninterval_sec = 900\nretries = 3\n"
    )
    folder = harbor_folder(tmp_path / "task", toml=toml, test="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    cancel = CancelState()
    base = image_task_config.workspace_base

    def checked_once() -> bool:
        logs = [folder / "log.txt" for folder in base.iterdir() if (folder / "log.txt").is_file()]
        return any("\nchecked-once" in log.read_text(errors="replace") for log in logs)

    seen = []

    def cancel_after_the_first_check():
        with contextlib.suppress(AssertionError):  # not seen: said below, in the test's thread
            seen.append(wait_for(checked_once, 300, what="the first healthcheck"))
        cancel.set(Stop.CANCELLED, "cancelled by DELETE")

    thread = threading.Thread(target=cancel_after_the_first_check)
    thread.start()
    evaluation = evaluate(serve(tasks, folder), "echo agent-ran\n", config=image_task_config, sandbox="bwrap",
                          language="bash", cancel=cancel)  # fmt: skip
    thread.join()
    assert seen == [True], evaluation.log[-3000:]
    assert (evaluation.status, evaluation.error) == ("cancelled", "installing_deps: cancelled by DELETE"), (
        evaluation.error, evaluation.log[-3000:])  # fmt: skip
    assert "agent-ran" not in evaluation.agent_output
