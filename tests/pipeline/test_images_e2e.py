"""Tasks whose environment is an image (SPEC §16), through the whole pipeline: pulled from a real
registry on 127.0.0.1 (tests/helpers/images.py), run root in name only on the evaluation's own
writable layer, graded; and a task without a repository, run in the image's WorkingDir.

The image is the suite's Debian tree pushed as one layer (``base_image``); the host lacks its
``tree``, so a command that finds it ran in the image.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.helpers.images import layer, member, push_image
from tests.helpers.tasks import ADD_TEST, BUGGY, SOLVER
from tests.pipeline.test_e2e import evaluate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BASE_CONFIG = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}
IN_THE_IMAGE = """\
set -e
tree -L 1 . | grep -q calc.py
test "$(id -u)" = 0
test -w /etc && echo root-in-the-image
"""


@pytest.fixture
def config(image_task_config):
    return dataclasses.replace(image_task_config, install_timeout_secs=300)


def test_a_task_runs_in_the_image_it_names_and_the_second_pull_is_a_hit(tasks, config, base_image, tmp_path):
    assert shutil.which("tree") is None, "the host must lack the image's tool for this test to mean anything"
    config = dataclasses.replace(config, images_dir=tmp_path / "cold-images")  # unseeded: a cold pull
    _, ref, digest = base_image
    url = tasks.task(
        environment="{image: '" + ref + "'}",
        install=["tree --version", "apt-get --version >/dev/null"],
        tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_image.sh": IN_THE_IMAGE},
    )
    first = evaluate(url, SOLVER, config=config, sandbox="bwrap")
    assert (first.status, first.passed) == ("completed", True), (first.error, first.test_output, first.log[-3000:])
    assert "root-in-the-image" in first.test_output
    assert first.environment == {"kind": "image", "ref": ref, "digest": digest, "cached": False}
    assert "+    return a + b" in first.agent_patch
    steps = [t.step for t in first.transitions.all()]
    assert steps[:4] == ["queued", "downloading_task", "preparing_environment", "cloning_repo"]
    assert f"image {ref}: {digest}" in first.log
    second = evaluate(url, SOLVER, config=config, sandbox="bwrap")
    assert (second.status, second.passed) == ("completed", True), second.error
    assert second.environment == {"kind": "image", "ref": ref, "digest": digest, "cached": True}
    # The install step wrote the image's writable layer, which a cache entry does not keep: no cache.
    assert (first.cache, second.cache) == ("off", "off")


AS_THE_USER = """set -e
test "$(id -u):$(id -g)" = "1000:1000"
test "$FROM_IMAGE" = "image" && test "$OVERRIDDEN" = "by the task"
touch written-by-the-user && test -O written-by-the-user
! touch /usr/bin/planted 2>/dev/null
"""


def test_commands_run_as_the_images_user_with_its_env_under_the_tasks(tasks, config, base_image, base_layer):
    registry, _, _ = base_image
    passwd = b"root:x:0:0:root:/root:/bin/bash\nrunner:x:1000:1000::/home/runner:/bin/bash\n"
    extra = layer(member("etc/passwd", passwd))
    image = {**BASE_CONFIG, "User": "runner", "Env": [*BASE_CONFIG["Env"], "FROM_IMAGE=image", "OVERRIDDEN=image"]}
    pushed = push_image(registry, "test/as-runner:latest", layers=[base_layer, extra], config=image)
    repo_url, shas = tasks.repo([{"calc.py": BUGGY}])
    workspace = (
        f"repo: {repo_url}\nbase_commit: {shas[0]}\nenvironment: {{image: '{pushed.ref}'}}\n"
        "env: {OVERRIDDEN: by the task}\n"
    )
    url = tasks.task(workspace=workspace, tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_user.sh": AS_THE_USER})
    evaluation = evaluate(url, SOLVER, config=config, sandbox="bwrap")
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.test_output)


AGENT_INSTALLS = """\
import subprocess, os
for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends", "hello"]):
    done = subprocess.run(argv, capture_output=True, text=True)
    print(" ".join(argv), "->", done.returncode, done.stdout[-300:], done.stderr[-600:])
answer = subprocess.run(["hello"], capture_output=True, text=True).stdout.strip()
with open("answer.txt", "w") as handle:
    handle.write(answer + "\\n")
os.remove("old.txt")
print("cwd", os.getcwd())
"""

ANSWER_TEST = """\
set -e
test "$(cat answer.txt)" = "Hello, world!"
command -v hello  # what the agent installed anywhere in the image, the tests see
test ! -e old.txt
"""


def test_a_task_without_a_repository_runs_in_the_images_workdir_and_its_agent_installs_a_package(
    tasks, config, base_image, base_layer
):
    """apt-get by the agent at run time, as root in the image, through the egress proxy: the Debian
    mirror resolves to a TEST-NET address here, allowed for this test alone."""
    registry, _, _ = base_image
    extra = layer(member("app/", type="dir"), member("app/old.txt", b"from the image\n"))
    pushed = push_image(
        registry, "test/with-app:latest", layers=[base_layer, extra], config={**BASE_CONFIG, "WorkingDir": "/app"}
    )
    config = dataclasses.replace(config, egress_allow=("deb.debian.org",), agent_timeout_secs=300)
    url = tasks.task(
        workspace="environment: {image: '" + pushed.ref + "'}\n",
        tests={"fail_to_pass_answer.sh": ANSWER_TEST},
    )
    evaluation = evaluate(url, AGENT_INSTALLS, config=config, sandbox="bwrap")
    assert (evaluation.status, evaluation.passed) == ("completed", True), (
        evaluation.error,
        evaluation.agent_output[-3000:],
        evaluation.test_output,
    )
    assert "cwd /app" in evaluation.agent_output
    assert evaluation.cache == "off"
    patch = evaluation.agent_patch
    assert "diff --git a/answer.txt b/answer.txt\nnew file mode 100644" in patch
    assert "+Hello, world!" in patch
    assert "deleted file mode 100644\n--- a/old.txt" in patch
    assert "usr/bin/hello" not in patch  # outside WorkingDir


def test_an_unknown_tag_is_the_tasks_fault_and_an_unreachable_registry_the_hosts(tasks, config, base_image):
    registry, ref, _ = base_image
    missing = evaluate(tasks.task(environment="{image: '" + ref + "-nope'}"), SOLVER, config=config, sandbox="bwrap")
    assert (missing.status, missing.error_kind) == ("failed", "task_invalid"), missing.error
    assert missing.error.startswith("preparing_environment: ")
    closed = dataclasses.replace(config, image_insecure_registries=("127.0.0.1:9",))
    url = tasks.task(environment="{image: '127.0.0.1:9/base/debian:bookworm'}")
    unreachable = evaluate(url, SOLVER, config=closed, sandbox="bwrap")
    assert (unreachable.status, unreachable.error_kind) == ("failed", "infrastructure"), unreachable.error


GHOST = "registry.invalid/nowhere/ghost:1.0"  # a name no registry here has: only IMAGE_REWRITES reaches it


def test_an_image_named_nowhere_runs_in_the_image_image_rewrites_names(tasks, config, base_image):
    """SPEC §22: a host that reaches only its own registry runs the task's image from there; the
    evaluation records the reference pulled and the one the task wrote."""
    _, ref, digest = base_image
    config = dataclasses.replace(config, image_rewrites=((GHOST, ref),))
    url = tasks.task(environment="{image: '" + GHOST + "'}", tests={"fail_to_pass_add.sh": ADD_TEST})
    evaluation = evaluate(url, SOLVER, config=config, sandbox="bwrap")
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.log[-3000:])
    assert {key: evaluation.environment[key] for key in ("kind", "ref", "rewritten_from", "digest")} == {
        "kind": "image", "ref": ref, "rewritten_from": GHOST, "digest": digest,
    }  # fmt: skip
    assert f"image {GHOST} rewritten to {ref} (IMAGE_REWRITES)" in evaluation.log


def test_a_dockerfiles_from_is_rewritten_as_a_hub_reference(tasks, config, base_image, tmp_path):
    """``FROM python:3.12`` is Docker Hub's ``docker.io/library/python:3.12``: the setting written
    in the long form rewrites it, and the build's record lists the rewrite."""
    _, ref, _ = base_image
    images = Path(tempfile.mkdtemp(prefix="te-images-", dir="/tmp"))
    os.chmod(images, 0o711)
    rewrites = (("docker.io/library/python:3.12", ref),)
    config = dataclasses.replace(config, images_dir=images, image_rewrites=rewrites)
    url = tasks.task(
        workspace="environment: {dockerfile: Dockerfile}\n",
        tests={"pass_to_pass_built.sh": 'set -e\ntest -e /etc/debian_version && test "$BUILT" = yes\n'},
        extra={"Dockerfile": "FROM python:3.12\nENV BUILT=yes\n"},
    )
    try:
        evaluation = evaluate(url, SOLVER, config=config, sandbox="bwrap")
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(images)], check=False)
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.log[-3000:])
    assert evaluation.environment["ref"] == "Dockerfile"
    assert evaluation.environment["rewrites"] == [{"ref": ref, "rewritten_from": "python:3.12"}]


DOCKERFILE = """\
ARG BASE
FROM ${BASE} AS tools
RUN apt-get update -q && apt-get install -y -q --no-install-recommends hello && hello > /greeting.txt

FROM ${BASE}
COPY --from=tools /greeting.txt /usr/bin/hello /opt/
ENV GREETING_FILE=/opt/greeting.txt
WORKDIR /work
COPY data.txt ./
"""

BUILT_TEST = """\
set -e
test "$(cat "$GREETING_FILE")" = "Hello, world!"
/opt/hello | grep -q Hello
test "$(cat /work/data.txt)" = "from the context"
"""


def test_a_task_builds_its_dockerfile_and_the_second_evaluation_reuses_every_step(tasks, config, base_image, tmp_path):
    """A multi-stage Dockerfile whose RUN installs a Debian package through the egress proxy (the
    mirror allowed for this test alone); the second evaluation builds nothing."""
    _, ref, _ = base_image
    images = tmp_path / "images"  # 0700 on the way, as a DATA_DIR: a build's roots are mounted in WORKSPACE_BASE
    config = dataclasses.replace(config, images_dir=images, egress_allow=("deb.debian.org",))
    repo_url, shas = tasks.repo([{"calc.py": BUGGY}])
    workspace = (
        f"repo: {repo_url}\nbase_commit: {shas[0]}\n"
        f"environment: {{dockerfile: environment/Dockerfile, build_args: {{BASE: '{ref}'}}}}\n"
    )
    url = tasks.task(
        workspace=workspace,
        tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_built.sh": BUILT_TEST},
        extra={"environment/Dockerfile": DOCKERFILE, "environment/data.txt": "from the context\n"},
    )
    try:
        first = evaluate(url, SOLVER, config=config, sandbox="bwrap")
        assert (first.status, first.passed) == ("completed", True), (first.error, first.test_output, first.log[-3000:])
        assert first.environment["kind"] == "dockerfile" and first.environment["cached"] is False
        assert first.environment["ref"] == "environment/Dockerfile"
        assert "RUN apt-get update" in first.log
        second = evaluate(url, SOLVER, config=config, sandbox="bwrap")
        assert (second.status, second.passed) == ("completed", True), second.error
        assert second.environment == {**first.environment, "cached": True}
        assert "RUN apt-get update" not in second.log.split("=== preparing_environment ===")[1].split("===")[0]
        assert not any((config.workspace_base / ".image-builds").iterdir())  # each build's roots went with it
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(images)], check=False)


def test_a_failing_run_is_the_tasks_fault_with_its_line(tasks, config, base_image, tmp_path):
    _, ref, _ = base_image
    images = Path(tempfile.mkdtemp(prefix="te-images-", dir="/tmp"))
    os.chmod(images, 0o711)
    config = dataclasses.replace(config, images_dir=images)
    url = tasks.task(
        workspace="environment: {dockerfile: Dockerfile}\n",
        extra={"Dockerfile": f"FROM {ref}\nENV A=1\nRUN echo building; exit 3\n"},
    )
    try:
        evaluation = evaluate(url, SOLVER, config=config, sandbox="bwrap")
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(images)], check=False)
    assert (evaluation.status, evaluation.error_kind) == ("failed", "task_invalid"), evaluation.error
    assert evaluation.error.startswith("preparing_environment: ") and "line 3" in evaluation.error
    assert "building" in evaluation.error


def test_an_images_install_commands_share_a_sandbox_and_its_tests_another_leaving_nothing_in_its_layer(
    tasks, config, base_image
):
    """SPEC §25 in an image: each phase's commands are execs in one sandbox (the markers each sees in
    its /dev/shm), the init run from a descriptor, so the image's layer gains no mount point for it."""
    _, ref, _ = base_image
    count = "echo $(ls /dev/shm | grep -c '^seen-') >> {log}; touch /dev/shm/seen-$RANDOM$RANDOM\n"
    url = tasks.task(
        workspace="environment: {image: '" + ref + "'}\n",
        install=[count.format(log="/root/install.log")] * 2,
        tests={
            "a_first.sh": count.format(log="/root/tests.log"),
            "b_second.sh": count.format(log="/root/tests.log")
            + "test ! -e /run/te-init && cat /root/install.log /root/tests.log | tr '\\n' ' '\n",
        },
    )
    agent = "import os; print('mount point left:', os.path.lexists('/run/te-init'))\n"
    evaluation = evaluate(url, agent, config=config, sandbox="bwrap")
    first, second = evaluation.test_results.all()
    assert first.passed and second.passed, (evaluation.error, first.output, second.output)
    assert second.output.split() == ["0", "1", "0", "1"]  # install: one sandbox; tests: another
    assert "mount point left: False" in evaluation.agent_output  # the install's sandbox left none in the layer
