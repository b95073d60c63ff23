"""SPEC §23: a Harbor task's compose ``volumes`` through the whole pipeline: a named volume one folder of
the session bound in main (its first process, the agent, the verifier) and in every service naming it
(``:ro`` and ``read_only`` honoured, counted by the disk quota), and Harbor's log folders
(``${HOST_ARTIFACTS_PATH}:${ENV_ARTIFACTS_PATH}``) in a service: the session's own folder main has there."""

from __future__ import annotations

import dataclasses
import json
import uuid

import pytest

from tests.pipeline.test_compose_services_e2e import images, left_running, task  # noqa: F401
from tests.pipeline.test_e2e import evaluate
from tests.pipeline.test_harbor_e2e import serve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WAIT = "for i in $(seq 300); do {test} && break; sleep 0.1; done\n"  # what a service writes as it starts


def test_a_named_volume_is_shared_by_mains_first_process_a_service_the_agent_and_the_verifier(
    tasks,
    image_task_config,
    images,  # noqa: F811
    tmp_path,
):
    main, web = images
    marker = f"compose-volume-{uuid.uuid4().hex}"
    sidecar = (  # Harbor's environment-env-multi, and a write where its volume is read-only
        "printf '%s' \"$${HARBOR_STARTUP_ENV_TEST-unset}\" > /startup/sidecar-env; "
        "(echo x > /ro/side-ro) 2> /startup/side-ro-error; exec sleep infinity"
    )
    compose = {
        "services": {
            "main": {
                "depends_on": {"sidecar": {"condition": "service_started"}},
                "entrypoint": ["sh", "-c", "printf main > /startup/main-env; exec sleep infinity"],
                "volumes": ["startup-evidence:/startup", "startup-evidence:/view:ro"],
            },
            "sidecar": {
                "image": web,
                "command": ["sh", "-c", sidecar, marker],
                "environment": {"HARBOR_STARTUP_ENV_TEST": "from-sidecar"},
                "volumes": [
                    "startup-evidence:/startup",
                    {"type": "volume", "source": "startup-evidence", "target": "/ro", "read_only": True},
                ],
            },
        },
        "volumes": {"startup-evidence": None},
    }
    test = (
        "#!/bin/bash\n"
        "m=$(cat /startup/main-env); s=$(cat /startup/sidecar-env); a=$(cat /view/agent-env); e=$(cat /startup/side-ro-error)\n"
        'echo "main=$m sidecar=$s agent=$a error=$e"; ls -ln /startup\n'
        'if [ "$m" = main ] && [ "$s" = from-sidecar ] && [ "$a" = agent ] && [ ! -e /startup/agent-ro ] '
        '&& [ ! -e /startup/side-ro ] && [[ "$e" == *Read-only* ]]; then echo 1 > /logs/verifier/reward.txt; '
        "else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    folder = task(tmp_path / "volume", main, compose, test=test)
    agent = (
        WAIT.format(test="[ -f /startup/main-env ] && [ -f /startup/side-ro-error ]")
        + "echo agent > /startup/agent-env\n(echo x > /view/agent-ro) 2>&1\ncat /startup/main-env /view/sidecar-env\n"
    )
    evaluation = evaluate(serve(tasks, folder), agent, config=image_task_config, sandbox="bwrap", language="bash")
    assert "mainfrom-sidecar" in evaluation.agent_output, (evaluation.agent_output, evaluation.log[-3000:])
    assert "/view/agent-ro: Read-only file system" in evaluation.agent_output, evaluation.agent_output
    assert "main=main sidecar=from-sidecar agent=agent error=" in evaluation.test_output, evaluation.test_output
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.test_output)
    # the volumes' mount points in main's root are the executor's, not the agent's changes
    paths = (evaluation.system_changes or {}).get("paths", [])
    assert not [path for path in paths if path.startswith(("startup", "view"))], paths
    assert left_running(marker) == []


def test_a_services_log_folder_is_the_one_main_has_and_its_files_are_collected(
    tasks,
    image_task_config,
    images,  # noqa: F811
    tmp_path,
):
    main, web = images
    marker = f"compose-logs-{uuid.uuid4().hex}"
    # Harbor's network-policy-matrix/static/compose-sidecar-controlled
    write = "id -u > /logs/artifacts/sidecar-network-status.txt; echo reachable >> /logs/artifacts/sidecar-network-status.txt"
    compose = {
        "services": {
            "main": {"depends_on": ["sidecar"]},
            "sidecar": {
                "image": web,
                "command": ["sh", "-c", f"{write}; exec sleep infinity", marker],
                "volumes": ["${HOST_ARTIFACTS_PATH}:${ENV_ARTIFACTS_PATH}", "${HOST_AGENT_LOGS_PATH}:/logs/agent:ro"],
            },
        }
    }
    folder = task(tmp_path / "logs", main, compose, test="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    status = "/logs/artifacts/sidecar-network-status.txt"
    agent = WAIT.format(test=f"grep -q reachable {status}") + f"cat {status}\n"
    evaluation = evaluate(serve(tasks, folder), agent, config=image_task_config, sandbox="bwrap", language="bash")
    assert "reachable" in evaluation.agent_output, (evaluation.agent_output, evaluation.log[-3000:])
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    listed = [artifact["path"] for artifact in evaluation.artifacts]
    assert "artifacts/logs/artifacts/sidecar-network-status.txt" in listed, listed
    assert left_running(marker) == []


def test_what_a_service_writes_into_a_volume_counts_in_the_disk_quota(
    tasks,
    image_task_config,
    images,  # noqa: F811
    tmp_path,
):
    main, web = images
    marker = f"compose-big-{uuid.uuid4().hex}"
    fill = "for i in 1 2 3 4; do head -c 40M /dev/zero > /data/big$$i; done; touch /data/done; exec sleep infinity"
    compose = {
        "services": {
            "main": {"depends_on": {"filler": {"condition": "service_healthy"}}, "volumes": ["data:/data:ro"]},
            "filler": {
                "image": web,
                "command": ["sh", "-c", fill, marker],
                "healthcheck": {"test": "test -f /data/done", "interval": "100ms", "retries": 600},
                "volumes": ["data:/data"],
            },
        },
        "volumes": {"data": {}},
    }
    folder = task(tmp_path / "big", main, compose, test="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    config = dataclasses.replace(image_task_config, disk_quota_mb=100)
    evaluation = evaluate(serve(tasks, folder), "ls /data; sleep 30\n", config=config, sandbox="bwrap",
                          language="bash")  # fmt: skip
    assert (evaluation.status, evaluation.error_kind) == ("failed", "limit_exceeded"), evaluation.error
    assert "disk quota exceeded" in evaluation.error, evaluation.error
    assert left_running(marker) == []


def test_a_named_volume_outlives_each_step_and_a_services_log_folder_is_the_first_steps(
    tasks,
    image_task_config,
    images,  # noqa: F811
    tmp_path,
):
    main, web = images
    marker = f"compose-steps-{uuid.uuid4().hex}"
    compose = {
        "services": {
            "main": {"depends_on": ["side"], "volumes": ["data:/data"]},
            "side": {
                "image": web,
                "command": ["sh", "-c", "echo side > /logs/artifacts/side.txt; exec sleep infinity", marker],
                "volumes": ["data:/data", "${HOST_ARTIFACTS_PATH}:${ENV_ARTIFACTS_PATH}"],
            },
        },
        "volumes": {"data": None},
    }
    root = tmp_path / "steps"
    files = {
        "task.toml": f'[environment]\ndocker_image = "{main}"\n[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n',
        "steps/one/instruction.md": "One.",
        "steps/one/tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
        "steps/two/instruction.md": "Two.",
        # step two's: what step one's agent left in the volume, and no side.txt in step two's /logs/artifacts
        "tests/test.sh": "#!/bin/bash\nls /data /logs/artifacts\n"
        '[ "$(cat /data/one)" = one ] && [ ! -e /logs/artifacts/side.txt ] && r=1 || r=0\n'
        "echo $r > /logs/verifier/reward.txt\n",
        "environment/docker-compose.yaml": json.dumps(compose),
    }
    for relpath, text in files.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_text(text)
    agent = (
        'if [ "$TASK_STEP" = one ]; then '
        + WAIT.format(test="[ -f /logs/artifacts/side.txt ]").strip()
        + "; cat /logs/artifacts/side.txt; echo one > /data/one; fi\n"
    )
    evaluation = evaluate(serve(tasks, root), agent, config=image_task_config, sandbox="bwrap", language="bash")
    assert "side" in evaluation.agent_output, (evaluation.agent_output, evaluation.log[-3000:])
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    assert [step["reward"] for step in evaluation.steps] == [1.0, 1.0], evaluation.steps
    assert left_running(marker) == []
