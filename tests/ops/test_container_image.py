"""The official image for real: built from the Dockerfile with podman (FROM the base .ci/base-image makes
with debootstrap, as a host that reaches only its own registry would), run with docs/operating.md's
`docker run` line (podman for docker; host networking on 127.0.0.1 instead of -p), and driven over HTTP:
the calc example, an image task from the suite's registry, a Harbor task built from its Dockerfile, a live
sandbox with its execs; and contained as on a host: an agent reaches no service of the host's 127.0.0.1,
and cannot read another sandbox's files.

.ci/image reuses the image an unchanged checkout built (a content-hash tag) and podman's layer cache.
The service in the container shares the host's uids (rootful podman has no user namespace), so it gets
uid and image id ranges of its own: the suite's services on the host use the defaults.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import uuid

import pytest

from tests.helpers import harbor_venv
from tests.helpers.container import CGROUP_V1, OWN_IDS, cgroup_flags, remove
from tests.helpers.container import run_argv as container_line
from tests.helpers.http import request
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.polling import wait_for
from tests.helpers.service import PROJECT, free_port
from tests.helpers.tasks import ADD_TEST, SOLVER, TaskFactory
from tests.sandboxes.conftest import TOKEN as SANDBOX_TOKEN

pytestmark = pytest.mark.slow

TOKEN = SANDBOX_TOKEN  # what tests/sandboxes' Harbor runs pass
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def need_podman() -> None:
    """Rootful podman (the container's root is root's, as the docs' line runs it): a skip, or with
    REQUIRE_SANDBOX=1 (.ci/run, which installs it) a failure."""
    if shutil.which("podman") is None or os.geteuid() != 0:
        reason = "the container image tests need podman (apt-get install podman runc) and root"
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail(f"REQUIRE_SANDBOX=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def image() -> str:
    need_podman()
    built = subprocess.run([str(PROJECT / ".ci" / "image")], capture_output=True, text=True, timeout=3600)
    assert built.returncode == 0, built.stderr[-4000:]
    return built.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def www(tmp_path_factory):
    folder = tmp_path_factory.mktemp("www")
    (folder / "hello.txt").write_text("hello from the host\n")
    with TestHTTPServer(folder) as server:
        yield server, folder


class Container:
    def __init__(self, name: str, port: int, volumes: list[str]):
        self.name, self.port, self.volumes = name, port, volumes
        self.base_url = f"http://127.0.0.1:{port}"

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def call(self, method: str, path: str, body=None, timeout=120):
        reply = request(method, self.url(path), json_body=body, headers=AUTH, timeout=timeout)
        return reply.status, (reply.json() if reply.body else None)

    def evaluate(self, body: dict, timeout: float = 600) -> dict:
        status, created = self.call("POST", "/evaluate", body)
        assert status == 202, created
        eval_id = created["eval_id"]

        def done():
            shown = self.call("GET", f"/evaluate/{eval_id}")[1]
            return shown if shown["status"] in ("completed", "failed", "cancelled") else None

        return wait_for(done, timeout, interval=0.5, what=f"evaluation {eval_id} in the container")

    def logs(self) -> str:
        done = subprocess.run(["podman", "logs", "--tail", "80", self.name], capture_output=True, text=True)
        return done.stdout + done.stderr


def run_argv(image: str, name: str, env: dict[str, str]) -> tuple[list[str], list[str]]:
    """The docs' line (tests/helpers/container.py) with this module's token."""
    return container_line(image, name, env, TOKEN)


@pytest.fixture(scope="module")
def container(image, registry, hub_mirror, www):
    """The image run with the docs' line, on 127.0.0.1:<port> of the host's network."""
    name = f"te-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {
        "GUNICORN_BIND": f"127.0.0.1:{port}",
        "ALLOWED_PRIVATE_HOSTS": "127.0.0.1",  # the task archives and repositories of `www`
        "IMAGE_INSECURE_REGISTRIES": registry.host,
        "IMAGE_REGISTRY_MIRRORS": f"docker.io={hub_mirror.host}",  # a Harbor task's FROM debian:bookworm
        "EGRESS_ALLOW": f"127.0.0.1:{www[0].port}",  # the one host port agents may reach, through the proxy
        **OWN_IDS,
    }
    argv, volumes = run_argv(image, name, env)
    argv[-1:-1] = cgroup_flags(name)
    started = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, (argv, started.stderr)
    running = Container(name, port, volumes)
    try:
        wait_for(lambda: _healthy(running), 180, interval=0.5, what="the container's /health")
        yield running
    finally:
        remove(name, volumes)


def test_without_the_added_capabilities_it_refuses_to_start_naming_them(image):
    """The docs' line less its --cap-add flags: the engine's default root, which bin/serve refuses."""
    name = f"te-test-{uuid.uuid4().hex[:8]}"
    argv, volumes = run_argv(image, name, {"GUNICORN_BIND": f"127.0.0.1:{free_port()}", **OWN_IDS})
    for flag in ("SYS_ADMIN", "SYS_PTRACE", "MKNOD"):
        at = argv.index(flag)
        assert argv[at - 1] == "--cap-add"
        del argv[at - 1 : at + 1]
    argv.remove("-d")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    finally:
        remove(name, volumes)
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("term-executor: configuration error: the service runs as root without CAP_SYS_ADMIN"), last
    assert "(--cap-add SYS_ADMIN --cap-add SYS_PTRACE --cap-add MKNOD; docs/operating.md, Docker)" in last, last


def _healthy(container: Container) -> bool:
    state = subprocess.run(["podman", "inspect", "-f", "{{.State.Running}}", container.name], capture_output=True,
                           text=True).stdout.strip()  # fmt: skip
    assert state == "true", f"the container stopped:\n{container.logs()}"
    try:
        return request("GET", container.url("/health"), timeout=5).status == 200
    except OSError:
        return False


def test_the_service_runs_as_root_with_the_sandbox_its_own_uid_range_and_kernel_limits(container):
    status, body = container.call("GET", "/status")
    assert status == 200, body
    assert body["sandbox"] == "bwrap", body
    words = body["sandbox_state"]
    assert words.startswith("bubblewrap") and "commands run as uids 61000-61063 (one per evaluation)" in words, words
    kernel = "cgroup v1" if CGROUP_V1 else "cgroup v2"
    assert body["limits"] == {"memory": kernel, "processes": kernel}, (body, container.logs())
    assert not body["warnings"], body["warnings"]


def test_the_calc_example_passes(container, www, tmp_path):
    server, folder = www
    base_url = server.url("").rstrip("/")
    subprocess.run([sys.executable, "examples/build.py", base_url, str(folder)], cwd=PROJECT, check=True,
                   capture_output=True)  # fmt: skip
    result = container.evaluate(json.loads((folder / "calc-request.json").read_text()))
    assert (result["status"], result["passed"]) == ("completed", True), (result["error"], container.logs())
    assert "+    return a + b" in result["agent_patch"]


IN_IMAGE = """#!/bin/bash
set -e
test "$(id -u)" = 0 && test -w /etc && apt-get --version >/dev/null && echo in-image
"""


def test_an_image_task_from_the_registry_runs_root_in_name_only(container, www, base_image):
    server, folder = www
    _, ref, digest = base_image
    tasks = TaskFactory(folder, server.url(""))
    url = tasks.task(environment="{image: '" + ref + "'}",
                     tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_image.sh": IN_IMAGE})  # fmt: skip
    result = container.evaluate({"task_url": url, "agent_code": SOLVER})
    assert (result["status"], result["passed"]) == ("completed", True), (result["error"], container.logs())
    assert result["environment"]["kind"] == "image" and result["environment"]["digest"] == digest
    assert "in-image" in result["test_output"]


HARBOR_TEST = """#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/answer.txt)" = 42 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def test_a_harbor_task_is_built_from_its_dockerfile_and_graded(container, www, tmp_path):
    from tests.helpers.archives import Exec, write_archive

    server, folder = www
    files = {"task.toml": "[verifier]\ntimeout_sec = 120\n", "instruction.md": "Write 42 to /app/answer.txt.\n",
             "environment/Dockerfile": "FROM debian:bookworm\nRUN mkdir -p /app && echo built > /built\nWORKDIR /app\n",
             "tests/test.sh": Exec(HARBOR_TEST.encode())}  # fmt: skip
    name = f"harbor-{uuid.uuid4().hex[:8]}.tar.gz"
    write_archive(folder / name, files, "tar.gz", top="answer")
    agent = "#!/bin/bash\ntest -f /built && echo 42 > /app/answer.txt\n"
    result = container.evaluate({"task_url": server.url(f"/{name}"), "agent_code": agent, "agent_language": "bash"})
    assert (result["status"], result["reward"]) == ("completed", 1.0), (result["error"], container.logs())
    assert result["environment"]["kind"] == "dockerfile"


@pytest.fixture
def host_listener():
    """A TCP service on the host's 127.0.0.1 (where PostgreSQL listens in CI): what no agent may reach."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


REACH = """#!/bin/bash
for port in {ports}; do
  if timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; then echo "reached $port"; else echo "refused $port"; fi
done
for secret in {secrets}; do cat "$secret" 2>&1 && echo "read the secret" || echo "secret unreadable"; done
echo "sessions: $(ls /workspaces 2>&1 | tr '\\n' ' ')"
echo "uid $(id -u)"
for url in {proxied}; do  # through the evaluation's egress proxy (its variables, less NO_PROXY's 127.0.0.1)
  env -u no_proxy -u NO_PROXY python3 -c 'import sys, urllib.request
try:
    print("proxied", sys.argv[1], urllib.request.urlopen(sys.argv[1], timeout=20).read().decode().strip())
except Exception as error:
    print("proxy refused", sys.argv[1], error)' "$url"
done
"""


def test_a_live_sandbox_runs_execs_and_an_agent_reaches_neither_the_host_nor_it(container, www, base_image,
                                                                                host_listener):  # fmt: skip
    _, ref, _ = base_image
    status, created = container.call("POST", "/sandboxes", {"environment": {"image": ref}})
    assert status in (201, 202), created
    sandbox = created["sandbox_id"]
    try:
        wait_for(lambda: container.call("GET", f"/sandboxes/{sandbox}")[1]["status"] != "starting", 300,
                 interval=0.5, what="the sandbox to start")  # fmt: skip
        status, shown = container.call("GET", f"/sandboxes/{sandbox}")
        assert shown["status"] == "ready", (shown, container.logs())
        status, ran = container.call("POST", f"/sandboxes/{sandbox}/exec",
                                     {"command": "echo secret-of-the-sandbox > /root/secret && id -u"})  # fmt: skip
        assert (status, ran["exit_code"], ran["stdout"]) == (200, 0, "0\n"), ran
        # Where the sandbox's file lies in the container: the path an agent would have to guess.
        found = subprocess.run(["podman", "exec", container.name, "find", "/workspaces", "-name", "secret", "-path",
                                "*/root/secret"], capture_output=True, text=True, timeout=60)  # fmt: skip
        secrets = found.stdout.split()  # in the sandbox's root, and in its writable layer
        assert len(secrets) == 2, (found.stdout, found.stderr)
        # Root in name only: the image's root is the sandbox's leased uid on disk, its other ids a range of
        # IMAGE_UID_BASE's (65536 per leased uid), never the container's (the host's) root.
        status, ran = container.call("POST", f"/sandboxes/{sandbox}/exec",
                                     {"command": "touch /var/tmp/by-nobody", "user": "65534"})  # fmt: skip
        assert (status, ran["exit_code"]) == (200, 0), ran
        upper = next(path for path in secrets if "/.image/upper/" in path).removesuffix("/root/secret")
        owners = subprocess.run(["podman", "exec", container.name, "stat", "-c", "%u", f"{upper}/root/secret",
                                 f"{upper}/var/tmp/by-nobody"], capture_output=True, text=True, timeout=60)  # fmt: skip
        root_owner, nobody_owner = map(int, owners.stdout.split())
        assert 61000 <= root_owner < 61064, owners.stdout
        base = int(OWN_IDS["IMAGE_UID_BASE"]) + (root_owner - 61000) * 65536
        assert nobody_owner == base + 65534, (owners.stdout, base)
        ports = [host_listener] + ([5432] if _listening(5432) else [])
        server, folder = www
        tasks = TaskFactory(folder, server.url(""))
        url = tasks.task()
        allowed, refused = f"http://127.0.0.1:{server.port}/hello.txt", f"http://127.0.0.1:{host_listener}/"
        agent = REACH.format(ports=" ".join(map(str, ports)), secrets=" ".join(map(shlex.quote, secrets)),
                             proxied=f"{allowed} {refused}")  # fmt: skip
        result = container.evaluate({"task_url": url, "agent_code": agent, "agent_language": "bash"})
        out = result["agent_output"]
        for port in ports:
            assert f"refused {port}" in out, out
        assert out.count("secret unreadable") == 2 and "secret-of-the-sandbox" not in out, out
        sessions = re.search(r"^sessions: (.*)$", out, re.M).group(1)
        assert sandbox not in sessions and "sandbox-" not in sessions, out  # at most its own folder
        uid = int(re.search(r"uid (\d+)", out).group(1))
        assert 61000 <= uid < 61064, out
        # The egress proxy: EGRESS_ALLOW's host port reached, any other of the host's refused; both recorded.
        assert f"proxied {allowed} hello from the host" in out and f"proxy refused {refused}" in out, out
        seen = {(e["port"], e["allowed"]) for e in result["egress"] if e["host"] == "127.0.0.1"}
        assert {(server.port, True), (host_listener, False)} <= seen, result["egress"]
    finally:
        container.call("DELETE", f"/sandboxes/{sandbox}")


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


def test_the_image_is_tagged_by_content_and_its_base_is_a_build_argument(image):
    assert re.fullmatch(r"localhost/term-executor:ctx-[0-9a-f]{16}", image)
    again = subprocess.run([str(PROJECT / ".ci" / "image")], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.strip() == image and "building" not in again.stderr
    labels = subprocess.run(["podman", "image", "inspect", "-f", "{{.Config.Cmd}}", image], capture_output=True,
                            text=True).stdout  # fmt: skip
    assert "bin/serve" in labels


def test_harbor_runs_a_trial_on_the_containers_live_sandboxes(container, base_image, tmp_path):
    """The Harbor backend (term_executor_client.harbor, SPEC §24): real Harbor 0.25 builds a task's
    Dockerfile (its context sent to the container), runs the oracle and the verifier, reads the reward."""
    from tests.sandboxes.test_harbor_real import harbor_run, reward, write_task

    harbor = harbor_venv.ensure() / "bin" / "harbor"
    write_task(tmp_path / "dataset", "greet", base_image[1])
    results = harbor_run(harbor, container, tmp_path, tmp_path / "dataset", "oracle")
    assert [reward(result) for result in results] == [1.0]
    status, sandboxes = container.call("GET", "/sandboxes")
    assert status == 200 and not [s for s in sandboxes if s["status"] in ("starting", "ready")], sandboxes
