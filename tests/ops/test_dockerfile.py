"""The Dockerfile, read as text: what it copies exists, it runs the README's command, its base is a build
argument (and docs/operating.md's docker run line says what it needs). tests/ops/test_container_image.py
builds it with podman and runs it."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.helpers.service import PROJECT

DOCKERFILE = (PROJECT / "Dockerfile").read_text()
README = (PROJECT / "README.md").read_text()
OPERATING = (PROJECT / "docs" / "operating.md").read_text()  # its "Docker" section


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    logical, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        keyword, _, rest = current.strip().partition(" ")
        logical.append((keyword.upper(), rest.strip()))
        current = ""
    return logical


STEPS = instructions(DOCKERFILE)


def only(keyword: str) -> str:
    found = [args for kw, args in STEPS if kw == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {found}"
    return found[0]


def env() -> dict[str, str]:
    values = {}
    for kw, args in STEPS:
        if kw == "ENV":
            values.update(item.split("=", 1) for item in shlex.split(args))
    return values


def test_every_copied_path_exists():
    copies = [args for kw, args in STEPS if kw == "COPY"]
    assert copies
    for args in copies:
        words = [w for w in shlex.split(args) if not w.startswith("--")]
        for source in words[:-1]:
            assert (PROJECT / source).exists(), f"COPY {source}: not in the repository"
    for needed in ("manage.py", "requirements.txt", "bin/", "executor_project/", "evaluations/"):
        assert any(needed in args.split() for args in copies), f"{needed} is not copied"


def readme_command() -> str:
    """The README's way to run the service: the first command of its first shell block."""
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    return block.splitlines()[0].split("#")[0].strip()


def test_the_command_is_the_readmes_under_tini():
    assert readme_command() == "bin/serve"
    assert " ".join(json.loads(only("CMD"))) == readme_command()
    assert json.loads(only("ENTRYPOINT")) == ["/usr/bin/tini", "--"]


def test_the_base_is_a_build_argument_defaulting_to_pythons_bookworm():
    """FROM ${BASE_IMAGE}: a host that reaches only its own registry builds with --build-arg BASE_IMAGE=..."""
    assert STEPS[0] == ("ARG", "BASE_IMAGE=python:3.11-slim-bookworm")
    assert only("FROM") == "${BASE_IMAGE}"
    assert "--build-arg BASE_IMAGE=" in DOCKERFILE and "--build-arg BASE_IMAGE=" in OPERATING


def test_base_packages_root_healthcheck_and_volumes():
    installs = " ".join(args for kw, args in STEPS if kw == "RUN" and "apt-get install" in args).split()
    for package in ("git", "bubblewrap", "nodejs", "tini", "util-linux", "python3", "python3-pip",
                    "python3-venv", "build-essential"):  # fmt: skip  # gcc: the sandboxes' init, their egress relay too
        assert package in installs
    # The service is the container's root, as on a host: a uid per evaluation, image id ranges, mounts.
    assert not [args for kw, args in STEPS if kw == "USER"]
    assert "/health" in only("HEALTHCHECK")
    values = env()
    volumes = json.loads(only("VOLUME"))
    assert {values["DATA_DIR"], values["WORKSPACE_BASE"]} <= set(volumes)
    assert values["SANDBOX"] == "bwrap"  # no silent fallback to running untrusted code unsandboxed
    assert only("EXPOSE") == values["PORT"]


@pytest.mark.parametrize("flag", ["seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"])
def test_the_operator_guide_documents_the_docker_run_line_and_its_privileges(flag):
    run_lines = re.findall(r"docker run[^\n]*(?:\\\n[^\n]*)*", OPERATING)
    assert run_lines, "docs/operating.md has no docker run line"
    assert any(f"--security-opt {flag}" in line for line in run_lines)
    assert f"--security-opt {flag}" in DOCKERFILE  # the header says the same
    assert "--privileged" not in " ".join(run_lines)


# podman's default capabilities (Docker's add MKNOD, NET_RAW and AUDIT_WRITE).
PODMAN_DEFAULTS = {"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_NET_BIND_SERVICE",
                   "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT"}  # fmt: skip


def test_the_run_line_adds_exactly_the_capabilities_the_start_up_check_asks_for():
    from evaluations.runtime.capabilities import NEEDED_AS_ROOT

    line = re.search(r"^docker run [^\n]*", OPERATING, re.M).group(0)
    added = {"CAP_" + name for name in re.findall(r"--cap-add (\w+)", line)}
    assert added == set(NEEDED_AS_ROOT) - PODMAN_DEFAULTS == {"CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_MKNOD"}
    for name in added:
        assert f"--cap-add {name.removeprefix('CAP_')}" in DOCKERFILE  # the header says the same
        assert f"`--cap-add {name.removeprefix('CAP_')}`" in OPERATING  # and the guide's table says why


def test_the_build_context_leaves_local_state_out():
    ignored = (PROJECT / ".dockerignore").read_text().split()
    for path in (".venv", "data", ".git", "examples/build"):
        assert path in ignored


# The Debian package that puts each task language's program on the system PATH (SPEC §19).
TOOLCHAIN_PACKAGES = {"go": "golang-go", "cargo": "cargo", "node": "nodejs", "javac": "default-jdk-headless"}


def test_the_image_carries_every_task_languages_toolchain_and_our_builder_reads_it():
    from evaluations.images import dockerfile
    from evaluations.tasks.language import TOOLCHAINS

    assert [i.keyword for stage in dockerfile.parse(DOCKERFILE).stages for i in stage.instructions][0] == "RUN"
    installs = " ".join(args for kw, args in STEPS if kw == "RUN" and "apt-get install" in args).split()
    for program in set(TOOLCHAINS.values()):
        assert TOOLCHAIN_PACKAGES[program] in installs, program
    assert "rustc" in installs and "npm" in installs
    npm_globals = " ".join(args for kw, args in STEPS if kw == "RUN" and "npm install -g" in args).split()
    assert "yarn@1" in npm_globals and "pnpm@9" in npm_globals
