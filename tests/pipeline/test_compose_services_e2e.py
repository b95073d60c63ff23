"""SPEC §23: a Harbor task's environment/docker-compose.yaml with several services, through the whole
pipeline, on images pushed to the suite's registry: each service other than main a sandbox of its own,
started before the agent in ``depends_on`` order and awaited healthy, reached by the agent and the
verifier at ``name:port`` on the loopback they share, [[verifier.collect]] run in it after the agent,
nothing of it left after the evaluation."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import uuid

import pytest

from tests.helpers import images as images_helpers
from tests.pipeline.test_e2e import evaluate
from tests.pipeline.test_harbor_e2e import serve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FETCH = (
    'python3 -c "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"'
)


@pytest.fixture
def images(base_image, base_layer):
    """(main, service): the suite's Debian tree pushed twice, the service's with a page in /srv."""
    registry, _, _ = base_image
    config = {"Cmd": ["bash"], "Env": [PATH]}
    images_helpers.push_image(registry, "compose/main:1", layers=[base_layer], config=config)
    page = images_helpers.layer(images_helpers.member("srv/", type="dir", mode=0o777),
                                images_helpers.member("srv/hello.txt", b"hello from the service\n"))  # fmt: skip
    images_helpers.push_image(registry, "compose/web:1", layers=[base_layer, page], config=config)
    return f"{registry.host}/compose/main:1", f"{registry.host}/compose/web:1"


def task(root, main: str, compose: dict, *, test: str, toml: str = "", top: str = ""):
    files = {  # top: task.toml's top-level keys, before its tables
        "task.toml": top + f'[environment]\ndocker_image = "{main}"\nworkdir = "/app"\n' + toml,
        "instruction.md": "Fetch the page.\n",
        "environment/docker-compose.yaml": json.dumps(compose),  # JSON is YAML
        "tests/test.sh": test,
    }
    for relpath, text in files.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_text(text)
    (root / "tests/test.sh").chmod(0o755)
    return root


def server(port: int, marker: str, *, before: str = "") -> list[str]:
    """A service's command: ``before``, then python3's HTTP server of /srv on ``port``, its argv
    carrying ``marker`` (found by a scan if anything of it outlived the evaluation)."""
    # no exec: the shell stays, the server its child, and the marker its $0
    return ["sh", "-c", f"{before}python3 -m http.server {port} --bind 127.0.0.1 --directory /srv; :", marker]


def healthy(port: int, interval: str = "100ms") -> dict:
    url = f"http://127.0.0.1:{port}/"
    return {"test": ["CMD", "python3", "-c", f"import urllib.request; urllib.request.urlopen('{url}')"],
            "interval": interval, "retries": 100}  # fmt: skip


def left_running(marker: str) -> list[int]:
    """Host pids whose command line holds ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as file:
                    if marker.encode() in file.read():
                        found.append(int(name))
            except OSError:
                continue
    return found


def test_left_running_finds_a_process_by_the_marker_in_its_shells_arguments():
    marker = f"compose-check-{uuid.uuid4().hex}"
    shell = subprocess.Popen(["sh", "-c", "echo up; read line; :", marker], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert shell.stdout.readline() == b"up\n"  # it runs sh now (its command line is the marker's)
        assert left_running(marker) == [shell.pid]
    finally:
        shell.communicate(b"\n")
    assert left_running(marker) == []


def test_a_service_reached_by_name_by_the_agent_and_the_verifier_and_collect_run_in_it(
    tasks, image_task_config, images, tmp_path
):
    main, web = images
    marker = f"compose-web-{uuid.uuid4().hex}"
    compose = {
        "services": {
            "main": {"depends_on": {"web": {"condition": "service_healthy"}}},
            "web": {
                "image": web,
                "command": server(8080, marker),
                "healthcheck": healthy(8080),
                "environment": {"GREETING": "$$literal"},
                "ports": ["8080:8080"],
            },  # fmt: skip
        }
    }
    test = (
        "#!/bin/bash\n"
        f"{FETCH} http://web:8080/collected.txt > /logs/verifier/collected.txt\n"
        'grep -q "hello from the service" answer.txt && grep -q "collected \\$literal" /logs/verifier/collected.txt '
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
        "cat /logs/verifier/collected.txt; getent hosts web main\n"
    )
    toml = (  # an isolated verifier: a root made again, /etc/hosts written in it again
        "[verifier]\nisolated = true\n"
        '[[verifier.collect]]\nservice = "web"\ncommand = "echo collected $GREETING > /srv/collected.txt"\n'
        '[[verifier.collect]]\ncommand = "echo as $(id -un) in main"\nuser = "nobody"\n'
    )
    top = 'artifacts = [{source = "/srv/collected.txt", service = "web"}]\n'  # read from the service's root
    folder = task(tmp_path / "web", main, compose, test=test, toml=toml, top=top)
    agent = f"{FETCH} http://web:8080/hello.txt | tee answer.txt\n"
    evaluation = evaluate(serve(tasks, folder), agent, config=image_task_config, sandbox="bwrap", language="bash")
    assert "hello from the service" in evaluation.agent_output, (evaluation.agent_output, evaluation.log[-3000:])
    # The verifier: the service still runs, the collect command ran in it (its environment, its /srv) after the agent
    assert "collected $literal" in evaluation.test_output, (evaluation.test_output, evaluation.log[-3000:])
    assert "127.0.0.1       web" in evaluation.test_output and "127.0.0.1       main" in evaluation.test_output
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    assert (
        "healthcheck of service 'web': healthy" in evaluation.log
        and "collect 1 in service 'web': exit code 0" in evaluation.log
    )
    assert "collect 2 in service 'main': exit code 0" in evaluation.log and "as nobody in main" in evaluation.log
    assert "artifacts/srv/collected.txt" in [artifact["path"] for artifact in evaluation.artifacts]
    # /etc/hosts is the executor's, not something the agent changed
    assert "etc/hosts" not in (evaluation.system_changes or {}).get("paths", [])
    assert left_running(marker) == []


def test_depends_on_starts_a_service_after_the_one_it_waits_for(tasks, image_task_config, images, tmp_path):
    main, web = images
    marker = f"compose-order-{uuid.uuid4().hex}"
    # "front" is written first but waits for "back": its command fetches back's page as it starts
    before = f"{FETCH} http://back:8081/hello.txt > /srv/from-back.txt && "
    compose = {
        "services": {
            "main": {"depends_on": ["front"]},
            "front": {
                "image": web,
                "command": server(8082, marker, before=before),
                "healthcheck": healthy(8082),
                "depends_on": {"back": {"condition": "service_healthy"}},
            },  # fmt: skip
            "back": {"image": web, "command": server(8081, marker), "healthcheck": healthy(8081)},
        }
    }
    test = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"
    folder = task(tmp_path / "order", main, compose, test=test)
    agent = f"{FETCH} http://front:8082/from-back.txt\n"
    evaluation = evaluate(serve(tasks, folder), agent, config=image_task_config, sandbox="bwrap", language="bash")
    assert "hello from the service" in evaluation.agent_output, (evaluation.agent_output, evaluation.log[-3000:])
    back_healthy = evaluation.log.index("healthcheck of service 'back': healthy")
    assert back_healthy < evaluation.log.index("service 'front': starting")
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    assert left_running(marker) == []


def test_a_service_never_healthy_is_task_invalid_with_its_last_output(tasks, image_task_config, images, tmp_path):
    main, web = images
    marker = f"compose-sick-{uuid.uuid4().hex}"
    compose = {
        "services": {
            "main": {},
            "db": {
                "image": web,
                "command": ["sh", "-c", "sleep 1000; :", marker],
                "healthcheck": {"test": "echo not ready yet; exit 3", "interval": "50ms", "retries": 3},
            },  # fmt: skip
        }
    }
    folder = task(tmp_path / "sick", main, compose, test="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    evaluation = evaluate(serve(tasks, folder), "echo ran\n", config=image_task_config, sandbox="bwrap",
                          language="bash")  # fmt: skip
    assert (evaluation.status, evaluation.error_kind) == ("failed", "task_invalid"), evaluation.error
    assert "service 'db' never became healthy: " in evaluation.error, evaluation.error
    assert evaluation.error.endswith("exited 3 3 time(s) in a row: not ready yet"), evaluation.error
    assert evaluation.agent_output == ""  # the agent never ran
    assert left_running(marker) == []


def test_a_service_that_exits_before_it_is_healthy_is_task_invalid(tasks, image_task_config, images, tmp_path):
    main, web = images
    compose = {
        "services": {
            "main": {},
            "db": {"image": web, "command": ["sh", "-c", "echo cannot start; exit 7"], "healthcheck": healthy(9)},
        }
    }
    folder = task(tmp_path / "exits", main, compose, test="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    evaluation = evaluate(serve(tasks, folder), "echo ran\n", config=image_task_config, sandbox="bwrap",
                          language="bash")  # fmt: skip
    assert (evaluation.status, evaluation.error_kind) == ("failed", "task_invalid"), evaluation.error
    assert "service 'db' never became healthy: it exited with code 7: cannot start" in evaluation.error


def test_a_services_processes_count_in_the_evaluations_limit(tasks, image_task_config, images, tmp_path):
    main, web = images
    marker = f"compose-busy-{uuid.uuid4().hex}"
    # 20 processes in the service, 20 more in the agent: each alone under the limit of 32, together over it
    busy = "for i in $(seq 20); do sleep 1000 & done; touch /tmp/ready; wait"
    compose = {
        "services": {
            "main": {},
            "busy": {
                "image": web,
                "command": ["sh", "-c", busy, marker],
                "healthcheck": {"test": "test -f /tmp/ready", "interval": "100ms", "retries": 100},
            },  # fmt: skip
        }
    }
    folder = task(tmp_path / "busy", main, compose, test="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    config = dataclasses.replace(image_task_config, max_processes=32)
    agent = "for i in $(seq 20); do sleep 100 & done; wait\n"
    evaluation = evaluate(serve(tasks, folder), agent, config=config, sandbox="bwrap", language="bash")
    assert (evaluation.status, evaluation.error_kind) == ("failed", "limit_exceeded"), evaluation.error
    assert evaluation.error.startswith("running_agent: process limit exceeded"), evaluation.error
    assert left_running(marker) == []


def test_a_service_built_from_its_context_with_its_entrypoint_and_user(tasks, image_task_config, images, tmp_path):
    main, web = images
    marker = f"compose-built-{uuid.uuid4().hex}"
    compose = {
        "services": {
            "main": {"depends_on": {"built": {"condition": "service_healthy"}}},
            "built": {
                "build": {"context": "built", "args": {"WORD": "built"}},
                "user": "nobody",
                "entrypoint": ["sh", "-c"],  # the image's Cmd then goes too, as Docker runs it
                "command": [
                    "id -un > /srv/user.txt; python3 -m http.server 8083 --bind 127.0.0.1 --directory /srv; :",
                    marker,
                ],
                "healthcheck": healthy(8083),
            },  # fmt: skip
        }
    }
    folder = task(tmp_path / "built", main, compose, test="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (folder / "environment/built").mkdir()
    (folder / "environment/built/Dockerfile").write_text(
        f'FROM {web}\nARG WORD\nRUN echo "$WORD from its context" > /srv/built.txt && chmod 777 /srv\nCMD ["false"]\n'
    )
    agent = f"{FETCH} http://built:8083/built.txt\n{FETCH} http://built:8083/user.txt\n"
    evaluation = evaluate(serve(tasks, folder), agent, config=image_task_config, sandbox="bwrap", language="bash")
    assert "built from its context" in evaluation.agent_output, (evaluation.agent_output, evaluation.log[-3000:])
    assert "nobody" in evaluation.agent_output  # the service's user, resolved in its own image
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    assert left_running(marker) == []


def test_failures_within_the_start_period_do_not_count_and_a_keep_alive_command_starts_nothing(
    tasks, image_task_config, images, tmp_path
):
    main, web = images
    # Each check counts itself in the service's own /tmp and fails its first three times: with one retry
    # only, the start period (an hour) is what lets the fourth pass.
    # ($$: a literal $, Compose's escape)
    count = "n=$$(cat /tmp/checks 2>/dev/null || echo 0); echo $$((n + 1)) > /tmp/checks; echo check $$n; [ $$n -ge 3 ]"
    check = {"test": ["CMD-SHELL", count], "interval": "50ms", "start_interval": "50ms", "start_period": "1h",
             "retries": 1}  # fmt: skip
    compose = {"services": {"main": {}, "idle": {"image": web, "command": "sleep infinity", "healthcheck": check}}}
    folder = task(tmp_path / "idle", main, compose, test="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    evaluation = evaluate(serve(tasks, folder), "echo ran\n", config=image_task_config, sandbox="bwrap",
                          language="bash")  # fmt: skip
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    assert "service 'idle': nothing to start" in evaluation.log
    assert "healthcheck of service 'idle': healthy" in evaluation.log
    # The same check without a start period: its first failure is the last
    del check["start_period"]
    folder = task(tmp_path / "sick", main, compose, test="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    evaluation = evaluate(serve(tasks, folder), "echo ran\n", config=image_task_config, sandbox="bwrap",
                          language="bash")  # fmt: skip
    assert (evaluation.status, evaluation.error_kind) == ("failed", "task_invalid"), evaluation.error
    assert evaluation.error.endswith("exited 1 1 time(s) in a row: check 0"), evaluation.error
