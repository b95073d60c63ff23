"""SPEC §23: a Harbor task's compose ``volumes``: named volumes of the file's top-level ``volumes`` (in
main and in every other service) and Harbor's log folders (``${HOST_ARTIFACTS_PATH}:${ENV_ARTIFACTS_PATH}``)
in a service; every other source, target or volume option refused naming the service and the entry."""

from __future__ import annotations

import pytest

from evaluations.tasks.registry import load_task
from evaluations.tasks.spec import ServiceVolume
from tests.tasks.test_formats import error, harbor

# Harbor's example environment-env-multi, in short and long syntax
MULTI = """services:
  main:
    depends_on: {sidecar: {condition: service_started}}
    volumes: [ "startup-evidence:/startup" ]
  sidecar:
    image: alpine:3.21
    command: [sh, -c, "printf '%s' \\"$${HARBOR_STARTUP_ENV_TEST-unset}\\" > /startup/sidecar-env; exec sleep infinity"]
    volumes:
      - {type: volume, source: startup-evidence, target: /startup/, read_only: true}
      - "cache:/var/cache/app:rw"
volumes:
  startup-evidence:
  cache: {driver: local, name: app-cache}
"""

# Harbor's example network-policy-matrix/static/compose-sidecar-controlled
LOGS = """services:
  main: {volumes: ["${HOST_VERIFIER_LOGS_PATH}:${ENV_VERIFIER_LOGS_PATH}", "${HOST_ARTIFACTS_PATH}:/logs/artifacts"]}
  sidecar:
    image: alpine:3.21
    volumes: ["${HOST_ARTIFACTS_PATH}:${ENV_ARTIFACTS_PATH}", "$HOST_AGENT_LOGS_PATH:/logs/agent/:ro"]
"""


def test_named_volumes_are_bound_in_main_and_in_each_service_naming_them(tmp_path):
    spec = load_task(harbor(tmp_path, **{"environment/docker-compose.yaml": MULTI}))
    assert spec.volumes == (ServiceVolume(target="/startup", volume="startup-evidence"),)
    (sidecar,) = spec.services
    assert sidecar.volumes == (
        ServiceVolume(target="/startup", volume="startup-evidence", read_only=True),
        ServiceVolume(target="/var/cache/app", volume="cache"),
    )


def test_harbors_log_folders_are_the_sessions_own_in_a_service_and_nothing_more_in_main(tmp_path):
    spec = load_task(harbor(tmp_path, **{"environment/docker-compose.yaml": LOGS}))
    assert spec.volumes == ()  # main's are the executor's own
    (sidecar,) = spec.services
    assert sidecar.volumes == (
        ServiceVolume(target="/logs/artifacts", log_folder="/logs/artifacts"),
        ServiceVolume(target="/logs/agent", log_folder="/logs/agent", read_only=True),
    )


def test_a_single_service_keeps_its_bound_folder_beside_a_named_volume(tmp_path):
    compose = (
        "services:\n  main: {build: ., working_dir: /app, volumes: ['./:/app', 'data:/data']}\nvolumes: {data: {}}\n"
    )
    spec = load_task(harbor(tmp_path, **{"environment/docker-compose.yaml": compose}))
    assert spec.volumes == (ServiceVolume(target="/data", volume="data"),)
    assert spec.workdir_files is not None  # the task's folder, as before


FILE = "environment/docker-compose.yaml"
SIDE = f"{FILE}: service 'side': volume"


def compose(volume: str, declared: str = "data:") -> str:
    return f"services:\n  main: {{}}\n  side:\n    image: alpine\n    volumes: [{volume}]\nvolumes:\n  {declared}\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (compose("'other:/data'"),
         f"{SIDE} 'other:/data' names volume 'other', which the file's top-level 'volumes' does not declare"),
        ("services:\n  main: {volumes: ['data:/data']}\n  side: {image: alpine}\n",
         f"{FILE}: service 'main': volume 'data:/data' names volume 'data', which the file's top-level 'volumes' "
         "does not declare"),
        (compose("'data:/data'", "data: {driver: nfs}"),
         f"{FILE}: volume 'data': driver 'nfs' is not supported here (only the default, local)"),
        (compose("'data:/data'", "data: {driver_opts: {type: tmpfs}}"),
         f"{FILE}: volume 'data': 'driver_opts' is not supported here (a volume is a folder of the evaluation)"),
        (compose("'data:/data'", "data: {external: true}"),
         f"{FILE}: volume 'data': 'external' is not supported here (no volume outlives the evaluation)"),
        (compose("'data:/data'", "data: {labels: [a], size: 1}"),
         f"{FILE}: volume 'data': key 'size' is not supported here (a volume is a folder of the evaluation)"),
        (compose("'data:data'"), f"{SIDE} 'data:data': target 'data' must be an absolute path (without '..' or '$')"),
        (compose("{type: volume, source: data, target: ./x}"),
         f"{SIDE} {{'type': 'volume', 'source': 'data', 'target': './x'}}: target './x' must be an absolute path "
         "(without '..' or '$')"),
        (compose("'data:/srv/../x'"),
         f"{SIDE} 'data:/srv/../x': target '/srv/../x' must be an absolute path (without '..' or '$')"),
        (compose("'data:/logs/verifier'"),
         f"{SIDE} 'data:/logs/verifier': target /logs/verifier is over /logs, which the executor binds itself"),
        (compose("'data:/logs'"), f"{SIDE} 'data:/logs': target /logs is over /logs, which the executor binds itself"),
        (compose("'data:/tests/x'"),
         f"{SIDE} 'data:/tests/x': target /tests/x is over /tests, which the executor binds itself"),
        (compose("'data:/solution'"),
         f"{SIDE} 'data:/solution': target /solution is over /solution, which the executor binds itself"),
        (compose("'data:/proc'"), f"{SIDE} 'data:/proc': target /proc is over /proc, which the executor binds itself"),
        (compose("'data:/dev/shm'"),
         f"{SIDE} 'data:/dev/shm': target /dev/shm is over /dev, which the executor binds itself"),
        (compose("'data:/var'"), f"{SIDE} 'data:/var': target /var is over /var/tmp, which the executor binds itself"),
        (compose("'data:/'"), f"{SIDE} 'data:/': target / is over /proc, which the executor binds itself"),
        (compose("'data:/x:z'"), f"{SIDE} 'data:/x:z': mode 'z' is not supported here (only ro or rw)"),
        (compose("'data:/x', 'data:/x/'"), f"{SIDE} 'data:/x/': a second volume at /x"),
        (compose("'/data'"), f"{SIDE} '/data' is an anonymous volume (a target alone), which is not supported here"),
        (compose("'/etc:/data'"),
         f"{SIDE} '/etc:/data' binds a host path, which is not supported here (only a named volume of the file's "
         "top-level 'volumes', or Harbor's log folders)"),
        (compose("'./data:/data'"),
         f"{SIDE} './data:/data' binds a host path, which is not supported here (only a named volume of the file's "
         "top-level 'volumes', or Harbor's log folders)"),
        (compose("{type: bind, source: data, target: /data}"),
         f"{SIDE} {{'type': 'bind', 'source': 'data', 'target': '/data'}} binds a host path, which is not supported "
         "here (only a named volume of the file's top-level 'volumes', or Harbor's log folders)"),
        (compose("'${T_BENCH_TASK_LOGS_PATH}:${T_BENCH_CONTAINER_LOGS_PATH}'"),
         f"{SIDE} '${{T_BENCH_TASK_LOGS_PATH}}:${{T_BENCH_CONTAINER_LOGS_PATH}}' binds a host path, which is not "
         "supported here (only a named volume of the file's top-level 'volumes', or Harbor's log folders)"),
        (compose("'${DATA}:/data'"),
         f"{SIDE} '${{DATA}}:/data' takes its source from the host's environment or is no volume name; this executor "
         "passes nothing of its own environment to a task"),
        (compose("'$HOST_ARTIFACTS_PATH}:/logs/artifacts'"),
         f"{SIDE} '$HOST_ARTIFACTS_PATH}}:/logs/artifacts' takes its source from the host's environment or is no "
         "volume name; this executor passes nothing of its own environment to a task"),
        (compose("'${HOST_ARTIFACTS_PATH}:/data'"),
         f"{SIDE} '${{HOST_ARTIFACTS_PATH}}:/data' binds Harbor's /logs/artifacts elsewhere than at /logs/artifacts, "
         "which is not supported here"),
        (compose("'${HOST_ARTIFACTS_PATH}:${ENV_AGENT_LOGS_PATH}'"),
         f"{SIDE} '${{HOST_ARTIFACTS_PATH}}:${{ENV_AGENT_LOGS_PATH}}' binds Harbor's /logs/artifacts elsewhere than "
         "at /logs/artifacts, which is not supported here"),
        (compose("'${HOST_VERIFIER_LOGS_PATH}:${ENV_VERIFIER_LOGS_PATH}'"),
         f"{SIDE} '${{HOST_VERIFIER_LOGS_PATH}}:${{ENV_VERIFIER_LOGS_PATH}}': a service cannot share /logs/verifier "
         "here (it is made fresh for the verifier, after the services started)"),
        (compose("{type: tmpfs, target: /x}"),
         f"{SIDE} {{'type': 'tmpfs', 'target': '/x'}} is not supported here (only type volume or bind, with source, "
         "target and read_only)"),
        (compose("{type: volume, source: data, target: /x, read_only: maybe}"),
         f"{SIDE} {{'type': 'volume', 'source': 'data', 'target': '/x', 'read_only': 'maybe'}} needs a source and a "
         "target (strings) and read_only true or false"),
        ("services:\n  main: {}\n  side: {image: alpine, volumes: 'data:/x'}\n",
         f"{FILE}: service 'side': 'volumes' must be a list"),
        ("services:\n  main: {}\n  side: {image: alpine}\nvolumes: [data]\n",
         f"{FILE}: top-level 'volumes' must be a mapping of volume names"),
        ("services:\n  main: {volumes: ['/etc:/app']}\n  side: {image: alpine}\n",
         f"{FILE}: service 'main': volume /etc:/app binds a host path or a named volume, which is not supported here"),
    ],
)  # fmt: skip
def test_a_bad_volume_is_refused_naming_its_service_and_entry(tmp_path, text, message):
    assert error(harbor(tmp_path, **{FILE: text})) == message
