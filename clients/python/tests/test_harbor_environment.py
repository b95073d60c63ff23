"""TermExecutorEnvironment as Harbor 0.25 drives it: construction and validation, what start sends,
exec's env/user/cwd rules (Harbor's _merge_env and _resolve_user), files, network, stop.

Real Harbor objects (EnvironmentConfig, TrialPaths, NetworkPolicy) against a RecordingServer; the
real service and real `harbor run` are tests/sandboxes/test_harbor_real.py's."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from pathlib import Path

import pytest
from harbor.environments.base import BaseEnvironment, SandboxBuildFailedError
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from term_executor_client.harbor import TermExecutorEnvironment

from recording_server import as_answer

READY = {"sandbox_id": "sb1", "status": "ready"}


def exec_answer(stdout: str = "", exit_code: int = 0, **extra):
    return {"exit_code": exit_code, "stdout": stdout, "stderr": "", "timed_out": False, "truncated": False, **extra}


@pytest.fixture
def task(tmp_path) -> Path:
    """A Harbor task's environment/ folder with a Dockerfile and one file beside it."""
    environment = tmp_path / "task" / "environment"
    environment.mkdir(parents=True)
    (environment / "Dockerfile").write_text("FROM base/debian:bookworm\nWORKDIR /app\n")
    (environment / "setup.txt").write_text("setup")
    return environment


@pytest.fixture
def service(server):
    """The answers of a healthy service: created ready, execs succeed (``pwd`` says /app)."""
    server.answer("POST", "/sandboxes", 201, READY)
    server.respond(
        "POST",
        "/sandboxes/sb1/exec",
        lambda request: as_answer(200, exec_answer("/app\n" if request.json()["command"][-1] == "pwd" else "")),
    )
    server.answer("PUT", "/sandboxes/sb1/files", 204)
    server.answer("PUT", "/sandboxes/sb1/network", 200, {})
    server.answer("DELETE", "/sandboxes/sb1", 204)
    return server


def make(task: Path, server, tmp_path: Path, config: dict | None = None, **kwargs) -> TermExecutorEnvironment:
    kwargs.setdefault("url", server.url)
    kwargs.setdefault("token", "secret")
    return TermExecutorEnvironment(
        environment_dir=task,
        environment_name="hello",
        session_id="hello__abc__env",
        trial_paths=TrialPaths(trial_dir=tmp_path / "trial"),
        task_env_config=EnvironmentConfig(**(config or {})),
        **kwargs,
    )


@pytest.fixture
def run():
    """Runs coroutines on one event loop for the whole test, as Harbor runs a trial on one."""
    loop = asyncio.new_event_loop()
    yield loop.run_until_complete
    loop.close()


def execs(server) -> list[dict]:
    return [request.json() for request in server.received("POST", "/sandboxes/sb1/exec")]


# -- construction ----------------------------------------------------------


def test_it_is_a_harbor_environment_with_its_type_and_capabilities(task, server, tmp_path):
    environment = make(task, server, tmp_path)
    assert isinstance(environment, BaseEnvironment)
    assert environment.type() == "term-executor"
    capabilities = environment.capabilities
    assert capabilities.disable_internet and capabilities.network_allowlist and capabilities.dynamic_network_policy
    assert capabilities.docker_compose  # environment/docker-compose.yaml's services, beside main
    assert not (capabilities.gpus or capabilities.windows or capabilities.mounted)
    limits = TermExecutorEnvironment.resource_capabilities()
    assert limits.cpu_limit and limits.memory_limit and limits.fractional_cpus and not limits.cpu_request


def test_harbor_accepts_allowlists_of_names_wildcards_addresses_and_cidrs_of_both_families(task, server, tmp_path):
    environment = make(task, server, tmp_path)
    hosts = ["pypi.org", "*.github.com", "1.1.1.1", "10.0.0.0/8", "2001:db8::1", "2001:db8::/32"]
    for allowed in (hosts, *([host] for host in hosts)):  # Harbor's own check of our capabilities
        environment.validate_network_policy_support(
            NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=allowed)
        )
    environment.validate_network_policy_support(NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
    assert environment.capabilities.network_allowlist_ipv6_cidrs


def test_url_and_token_come_from_ek_or_the_environment(task, server, tmp_path, monkeypatch):
    server.answer("GET", "/sandboxes", 200, [])
    numeric = make(task, server, tmp_path, token=12345)  # --ek token=12345 arrives as an int
    assert numeric._client._http.headers["authorization"] == "Bearer 12345"
    monkeypatch.setenv("TERM_EXECUTOR_URL", server.url)
    monkeypatch.setenv("TERM_EXECUTOR_TOKEN", "from-env")
    from_env = make(task, server, tmp_path, url=None, token=None)
    assert from_env._client.url == server.url
    assert from_env._client._http.headers["authorization"] == "Bearer from-env"


def test_without_a_url_it_says_how_to_give_one(task, server, tmp_path):
    with pytest.raises(ValueError, match="TERM_EXECUTOR_URL"):
        make(task, server, tmp_path, url=None)


def test_a_task_without_dockerfile_or_image_is_refused(task, server, tmp_path):
    (task / "Dockerfile").unlink()
    with pytest.raises(FileNotFoundError, match="has no environment definition"):
        make(task, server, tmp_path)


def test_extra_compose_files_are_refused(task, server, tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("services: {}\n")
    with pytest.raises(ValueError, match="--extra-docker-compose files are not sent"):
        make(task, server, tmp_path, extra_docker_compose=[extra])


@pytest.mark.parametrize("image", [None, "127.0.0.1:5000/base/debian:bookworm"])
def test_a_compose_task_sends_its_compose_file_with_the_context(task, service, tmp_path, run, image):
    (task / "docker-compose.yaml").write_text("services:\n  db: {image: postgres}\n")
    if image is not None:
        (task / "Dockerfile").unlink()
    environment = make(task, service, tmp_path, {"docker_image": image} if image else None)
    assert environment._uses_compose
    run(environment.start(force_build=False))
    parts = service.received("POST", "/sandboxes")[0].parts()
    main = {"image": image} if image else {"dockerfile": "Dockerfile"}
    assert json.loads(parts["spec"][1])["environment"] == {**main, "compose": "docker-compose.yaml"}
    with tarfile.open(fileobj=io.BytesIO(parts["context"][1])) as tar:
        assert "docker-compose.yaml" in tar.getnames()
    assert not service.received("PUT", "/sandboxes/sb1/files")  # Harbor uploads nothing loose with compose


def test_sidecar_operations_name_their_service(task, service, tmp_path, run):
    environment = started(task, service, tmp_path, run, {"workdir": "/app", "env": {"TASK": "t"}})
    result = run(environment.service_exec("echo hi", service="db", timeout_sec=5, user="postgres"))
    assert result.return_code == 0
    (sent,) = execs(service)  # sh -c, none of main's workdir or variables: docker's sidecar exec
    assert sent == {"command": ["sh", "-c", "echo hi"], "timeout_secs": 5, "user": "postgres", "service": "db"}
    run(environment.service_exec("pwd", service="main"))
    assert execs(service)[-1]["command"][:2] == ["bash", "-c"] and "service" not in execs(service)[-1]
    service.respond("GET", "/sandboxes/sb1/files", lambda request: as_answer(200, b"dump"))
    run(environment.service_download_file("/srv/dump.sql", tmp_path / "out" / "dump.sql", service="db"))
    assert (tmp_path / "out" / "dump.sql").read_bytes() == b"dump"
    assert service.received("GET", "/sandboxes/sb1/files")[-1].query == {"path": "/srv/dump.sql", "service": "db"}
    service.respond("POST", "/sandboxes/sb1/services/main/stop", lambda request: as_answer(204, b""))
    run(environment.stop_service("main"))  # Harbor's trial, before it collects a sidecar's evidence
    assert [request.path for request in service.received("POST")][-1] == "/sandboxes/sb1/services/main/stop"


@pytest.mark.parametrize(
    ("config", "kwargs", "message"),
    [
        ({"os": "windows"}, {}, "does not support Windows"),
        ({"gpus": 1}, {}, "does not support GPU"),
        ({}, {"mounts": [{"type": "bind", "source": "/data", "target": "/data"}]}, "cannot bind folders"),
        ({}, {"cpu_enforcement_policy": "request"}, "does not support CPU resource requests"),
    ],
)
def test_what_it_cannot_do_is_refused_before_start(task, server, tmp_path, config, kwargs, message):
    with pytest.raises((ValueError, RuntimeError), match=message):
        make(task, server, tmp_path, config, **kwargs)
    assert server.requests == []


# -- start -----------------------------------------------------------------


def test_start_sends_the_environment_folder_as_context_with_the_task_limits(task, service, tmp_path, run):
    environment = make(
        task,
        service,
        tmp_path,
        {"cpus": 2, "memory_mb": 2048, "storage_mb": 4096, "env": {"TASK_VAR": "t"}},
        persistent_env={"TRIAL_VAR": "p"},
        network_policy=NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org"]),
        idle_timeout_secs="900",
    )
    run(environment.start(force_build=False))
    create = service.received("POST", "/sandboxes")[0]
    parts = create.parts()
    assert json.loads(parts["spec"][1]) == {
        "environment": {"dockerfile": "Dockerfile"},
        "network": {"mode": "allowlist", "allowed_hosts": ["pypi.org"]},
        "cpus": 2,
        "memory_mb": 2048,
        "storage_mb": 4096,
        "env": {"TASK_VAR": "t", "TRIAL_VAR": "p"},
        "idle_timeout_secs": 900,
    }
    with tarfile.open(fileobj=io.BytesIO(parts["context"][1])) as tar:
        assert sorted(tar.getnames()) == ["Dockerfile", "setup.txt"]
    assert environment.sandbox_id == "sb1"
    (mkdir,) = execs(service)  # a Dockerfile task: nothing more is uploaded
    assert mkdir["user"] == "root"
    assert mkdir["command"] == [
        "bash",
        "-c",
        "mkdir -p /logs/agent /logs/verifier /logs/artifacts && chmod 777 /logs/agent /logs/verifier /logs/artifacts",
    ]


def test_start_with_a_docker_image_sends_json_then_uploads_the_loose_files(task, service, tmp_path, run):
    (task / "Dockerfile").unlink()
    environment = make(task, service, tmp_path, {"docker_image": "127.0.0.1:5000/base/debian:bookworm"})
    run(environment.start(force_build=False))
    create = service.received("POST", "/sandboxes")[0]
    assert create.json() == {
        "environment": {"image": "127.0.0.1:5000/base/debian:bookworm"},
        "network": {"mode": "public", "allowed_hosts": []},
    }
    assert [e["command"][-1] for e in execs(service)][1:] == ["pwd"]  # after the log folders
    (upload,) = service.received("PUT", "/sandboxes/sb1/files")
    assert upload.query == {"path": "/app", "extract": "tar"}  # Harbor's rule: into the workdir


def test_force_build_prefers_the_dockerfile_over_the_image(task, service, tmp_path, run):
    environment = make(task, service, tmp_path, {"docker_image": "some/image:tag", "workdir": "/work"})
    run(environment.start(force_build=True))
    spec = json.loads(service.received("POST", "/sandboxes")[0].parts()["spec"][1])
    assert spec["environment"] == {"dockerfile": "Dockerfile"} and spec["workdir"] == "/work"


def test_start_waits_for_a_starting_sandbox(task, service, tmp_path, run):
    service.answer("POST", "/sandboxes", 202, {**READY, "status": "starting"})
    service.answer_in_turn("GET", "/sandboxes/sb1", [(200, {**READY, "status": "starting"}), (200, READY)])
    run(make(task, service, tmp_path).start(force_build=False))
    assert len(service.received("GET", "/sandboxes/sb1")) == 2
    assert len(execs(service)) == 1


def test_a_dockerfile_that_does_not_build_is_harbors_build_failure(task, service, tmp_path, run):
    failed = {**READY, "status": "failed", "error": "RUN apt-get exited 100", "error_kind": "task_invalid"}
    service.answer("POST", "/sandboxes", 202, {**READY, "status": "starting"})
    service.answer("GET", "/sandboxes/sb1", 200, failed)
    environment = make(task, service, tmp_path)
    with pytest.raises(SandboxBuildFailedError, match="RUN apt-get exited 100"):
        run(environment.start(force_build=False))
    assert environment.sandbox_id == "sb1"  # known, so Harbor's stop() deletes it
    run(environment.stop(delete=True))
    assert len(service.received("DELETE", "/sandboxes/sb1")) == 1


def test_a_full_service_is_an_error_naming_it(task, service, tmp_path, run):
    service.answer("POST", "/sandboxes", 503, {"error": "at_capacity", "detail": "32 sandboxes run (MAX_SANDBOXES)"})
    with pytest.raises(RuntimeError, match="at_capacity: 32 sandboxes"):
        run(make(task, service, tmp_path).start(force_build=False))


# -- exec ------------------------------------------------------------------


def started(task, service, tmp_path, run, config=None, **kwargs) -> TermExecutorEnvironment:
    environment = make(task, service, tmp_path, config, **kwargs)
    run(environment.start(force_build=False))
    service.requests.clear()
    return environment


def test_exec_merges_env_as_harbor_does(task, service, tmp_path, run):
    environment = started(
        task, service, tmp_path, run, {"env": {"TASK": "t", "X": "task"}}, persistent_env={"TRIAL": "p", "X": "trial"}
    )

    async def scenario():
        await environment.exec("true")
        await environment.exec("true", env={"X": "call", "CALL": "c"})
        with environment.scoped_exec_env({"X": "scoped", "AGENT": "a"}):
            await environment.exec("true", env={"X": "call"})

    run(scenario())
    assert [e["env"] for e in execs(service)] == [
        {"TASK": "t", "X": "trial", "TRIAL": "p"},
        {"TASK": "t", "X": "call", "TRIAL": "p", "CALL": "c"},
        {"TASK": "t", "X": "scoped", "TRIAL": "p", "AGENT": "a"},
    ]


def test_exec_user_is_the_calls_else_the_default_user_else_the_images(task, service, tmp_path, run):
    environment = started(task, service, tmp_path, run)

    async def scenario():
        await environment.exec("id")
        with environment.with_default_user("agent"):
            await environment.exec("id")
            await environment.exec("id", user="root")
            await environment.exec("id", user=1000)

    run(scenario())
    assert [e.get("user", "<image's>") for e in execs(service)] == ["<image's>", "agent", "root", 1000]


def test_exec_runs_bash_with_the_workdir_and_timeout(task, service, tmp_path, run):
    environment = started(task, service, tmp_path, run, {"workdir": "/work"})

    async def scenario():
        await environment.exec("echo $0", timeout_sec=30)
        await environment.exec("ls", cwd="/tmp", timeout_sec=0)

    run(scenario())
    first, second = execs(service)
    assert first == {"command": ["bash", "-c", "echo $0"], "cwd": "/work", "timeout_secs": 30}
    assert second == {"command": ["bash", "-c", "ls"], "cwd": "/tmp"}  # 0 is no timeout, as docker's


def test_exec_returns_harbors_exec_result(task, service, tmp_path, run):
    environment = started(task, service, tmp_path, run)
    service.answer("POST", "/sandboxes/sb1/exec", 200, {**exec_answer("out"), "stderr": "err", "exit_code": 3})
    result = run(environment.exec("false"))
    assert (result.stdout, result.stderr, result.return_code) == ("out", "err", 3)


def test_an_exec_past_its_timeout_raises_as_dockers_does(task, service, tmp_path, run):
    environment = started(task, service, tmp_path, run)
    service.answer("POST", "/sandboxes/sb1/exec", 200, exec_answer(exit_code=124, timed_out=True))
    with pytest.raises(RuntimeError, match="Command timed out after 5 seconds"):
        run(environment.exec("sleep 60", timeout_sec=5))


def test_exec_before_start_is_an_error(task, service, tmp_path, run):
    with pytest.raises(RuntimeError, match="not started"):
        run(make(task, service, tmp_path).exec("true"))


def test_exec_on_a_gone_sandbox_raises_the_services_error(task, service, tmp_path, run):
    environment = started(task, service, tmp_path, run)
    service.answer("POST", "/sandboxes/sb1/exec", 410, {"error": "gone", "detail": "sandbox sb1 expired"})
    with pytest.raises(RuntimeError, match="HTTP 410 gone: sandbox sb1 expired"):
        run(environment.exec("true"))


# -- files -----------------------------------------------------------------


def test_uploads_are_puts_of_a_file_or_a_tar(task, service, tmp_path, run):
    environment = started(task, service, tmp_path, run)
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    run(environment.upload_dir(tests, "/tests"))
    run(environment.upload_file(tests / "test.sh", "/installed/"))
    run(environment.upload_file(tests / "test.sh", "/installed/run.sh"))
    tar_put, dir_target, file_target = service.received("PUT", "/sandboxes/sb1/files")
    assert tar_put.query == {"path": "/tests", "extract": "tar"}
    with tarfile.open(fileobj=io.BytesIO(tar_put.body)) as tar:
        assert tar.getnames() == ["test.sh"]
    assert dir_target.query == {"path": "/installed/test.sh"}
    assert file_target.query == {"path": "/installed/run.sh"} and file_target.body.startswith(b"#!/bin/bash")


def test_downloads_write_files_and_unpack_folders_refusing_escapes(task, service, tmp_path, caplog, run):
    environment = started(task, service, tmp_path, run)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (("reward.txt", b"1"), ("../escape.txt", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    service.answer("GET", "/sandboxes/sb1/files", 200, buffer.getvalue())
    run(environment.download_dir("/logs/verifier", tmp_path / "out" / "verifier"))
    assert (tmp_path / "out" / "verifier" / "reward.txt").read_text() == "1"
    assert not (tmp_path / "out" / "escape.txt").exists()
    assert "not copied from /logs/verifier: ../escape.txt: a name leaving the folder" in caplog.text
    service.answer("GET", "/sandboxes/sb1/files", 200, b"oracle output")
    run(environment.download_file("/logs/agent/oracle.txt", tmp_path / "new" / "oracle.txt"))
    assert (tmp_path / "new" / "oracle.txt").read_bytes() == b"oracle output"
    assert service.received("GET")[-1].query == {"path": "/logs/agent/oracle.txt"}


def test_a_missing_download_raises_not_found(task, service, tmp_path, run):
    environment = started(task, service, tmp_path, run)
    with pytest.raises(RuntimeError, match="HTTP 404 not_found"):
        run(environment.download_file("/missing", tmp_path / "x"))


# -- network and stop ----------------------------------------------------


def test_a_phase_policy_is_put_and_the_baseline_restored(task, service, tmp_path, run):
    environment = started(task, service, tmp_path, run)
    allowlist = NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org", "10.0.0.0/8"])

    async def scenario():
        await environment.set_network_policy(allowlist)
        await environment.set_network_policy(allowlist)  # unchanged: Harbor sends nothing
        await environment.set_network_policy(NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
        await environment.set_network_policy(NetworkPolicy())

    run(scenario())
    assert [r.json() for r in service.received("PUT", "/sandboxes/sb1/network")] == [
        {"mode": "allowlist", "allowed_hosts": ["pypi.org", "10.0.0.0/8"]},
        {"mode": "no-network", "allowed_hosts": []},
        {"mode": "public", "allowed_hosts": []},
    ]


def test_stop_deletes_the_sandbox_unless_told_to_keep_it(task, service, tmp_path, run):
    kept = started(task, service, tmp_path, run)
    run(kept.stop(delete=False))
    assert service.received("DELETE") == []
    deleted = started(task, service, tmp_path, run)
    run(deleted.stop(delete=True))
    assert len(service.received("DELETE", "/sandboxes/sb1")) == 1
    run(deleted.stop(delete=True))  # again: nothing left to delete
    assert len(service.received("DELETE")) == 1


def test_stop_when_the_service_hangs_up_warns_and_returns(task, service, tmp_path, caplog, run):
    environment = started(task, service, tmp_path, run)
    service.answer("DELETE", "/sandboxes/sb1", 0)
    run(environment.stop(delete=True))
    assert "deleting sandbox sb1 failed: RemoteProtocolError" in caplog.text


def test_stop_of_a_sandbox_already_gone_is_quiet(task, service, tmp_path, caplog, run):
    environment = started(task, service, tmp_path, run)
    service.answer("DELETE", "/sandboxes/sb1", 410, {"error": "gone", "detail": "expired"})
    run(environment.stop(delete=True))
    assert "failed" not in caplog.text
