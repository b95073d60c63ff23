"""Listing and resolving environments on hand-made trees: names, links, bad folders, versions, identity."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess

import pytest

from evaluations import environments as envs
from evaluations.environments import BadEnvironment, UnknownEnvironment
from evaluations.pipeline.imageenv import choose_environment
from evaluations.tasks.registry import load_task
from executor_project.config import Config
from tests.helpers.environments import dpkg_status, executable, fake_environment


@pytest.fixture
def root(tmp_path):
    base = tmp_path / "environments"
    base.mkdir()
    fake_environment(base, "alpha")
    fake_environment(base, "beta")
    return base


def test_list_and_resolve(root):
    assert [env.name for env in envs.list_environments(root)] == ["alpha", "beta"]
    alpha = envs.resolve(root, "alpha")
    assert (alpha.name, alpha.root, alpha.python, alpha.node) == ("alpha", root / "alpha", None, None)
    assert envs.list_environments(None) == [] and envs.list_environments(root / "missing") == []


def test_an_unknown_name_says_what_there_is(root):
    with pytest.raises(UnknownEnvironment) as caught:
        envs.resolve(root, "gamma")
    assert str(caught.value) == "unknown environment: gamma (available: alpha, beta)"
    with pytest.raises(UnknownEnvironment) as caught:
        envs.resolve(root / "alpha" / "usr", "gamma")
    assert str(caught.value) == "unknown environment: gamma (available: none)"
    with pytest.raises(UnknownEnvironment) as caught:
        envs.resolve(None, "gamma")
    assert str(caught.value) == "unknown environment: gamma (available: none; ENVIRONMENTS_ROOT is not set)"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "an environment name must not be empty"),
        ("a/b", "environment name 'a/b' must not contain '/'"),
        ("../alpha", "environment name '../alpha' must not contain '/'"),
        ("..", "environment name '..' must not contain '..'"),
        ("a..b", "environment name 'a..b' must not contain '..'"),
        ("Alpha", "environment name 'Alpha' is not valid: lowercase letters, digits, '.', '_' and '-', starting with a letter or a digit"),
        (".hidden", "environment name '.hidden' is not valid: lowercase letters, digits, '.', '_' and '-', starting with a letter or a digit"),
        ("-x", "environment name '-x' is not valid: lowercase letters, digits, '.', '_' and '-', starting with a letter or a digit"),
        ("a b", "environment name 'a b' is not valid: lowercase letters, digits, '.', '_' and '-', starting with a letter or a digit"),
        ("x" * 65, f"environment name '{'x' * 65}' is longer than 64 characters"),
        (3, "an environment name must be a string"),
    ],
)  # fmt: skip
def test_bad_names_are_refused_before_any_lookup(root, name, message):
    with pytest.raises(BadEnvironment) as caught:
        envs.resolve(root, name)
    assert str(caught.value) == message
    assert not isinstance(caught.value, UnknownEnvironment)


def test_good_names(root):
    for name in ("a", "0", "py3.12", "debian_12-slim", "x" * 64):
        assert envs.check_name(name) == name


def test_a_folder_without_bin_sh_is_refused_and_not_listed(root):
    fake_environment(root, "nosh", sh=False)
    with pytest.raises(BadEnvironment) as caught:
        envs.resolve(root, "nosh")
    assert str(caught.value) == "environment nosh has no bin/sh (an executable file, links resolved inside it)"
    assert "nosh" not in [env.name for env in envs.list_environments(root)]


def test_bin_sh_is_resolved_inside_the_environment_never_on_the_host(root):
    # The host has /usr/bin/sh; an environment whose bin links to /usr/bin (absolute) must have its own.
    assert os.path.exists("/usr/bin/sh")
    tree = root / "abs"
    (tree / "usr" / "bin").mkdir(parents=True)
    (tree / "bin").symlink_to("/usr/bin")
    with pytest.raises(BadEnvironment, match="has no bin/sh"):
        envs.resolve(root, "abs")
    executable(tree / "usr" / "bin" / "bash")
    (tree / "usr" / "bin" / "sh").symlink_to("/usr/bin/bash")  # absolute, inside
    assert envs.resolve(root, "abs").name == "abs"
    # A link climbing out with .. stops at the environment's root, as it would at /.
    (tree / "usr" / "bin" / "sh").unlink()
    (tree / "usr" / "bin" / "sh").symlink_to("../../../../../../../usr/bin/dash")
    with pytest.raises(BadEnvironment, match="has no bin/sh"):
        envs.resolve(root, "abs")
    assert envs.inside(tree, "bin/sh") is None and envs.inside(tree, "bin/bash") == "/usr/bin/bash"


def test_bin_sh_must_be_an_executable_file(root):
    tree = fake_environment(root, "odd")
    os.chmod(tree / "usr" / "bin" / "dash", 0o644)
    with pytest.raises(BadEnvironment, match="has no bin/sh"):
        envs.resolve(root, "odd")
    (tree / "usr" / "bin" / "dash").unlink()
    (tree / "usr" / "bin" / "dash").mkdir()
    with pytest.raises(BadEnvironment, match="has no bin/sh"):
        envs.resolve(root, "odd")


def test_a_link_loop_is_no_bin_sh(root):
    tree = fake_environment(root, "loop", sh=False)
    (tree / "usr" / "bin" / "sh").symlink_to("sh2")
    (tree / "usr" / "bin" / "sh2").symlink_to("/bin/sh")
    with pytest.raises(BadEnvironment, match="has no bin/sh"):
        envs.resolve(root, "loop")


def test_no_usr_folder(root):
    tree = fake_environment(root, "bare", usr=False)
    executable(tree / "bin" / "sh")
    with pytest.raises(BadEnvironment) as caught:
        envs.resolve(root, "bare")
    assert str(caught.value) == "environment bare has no usr/ folder"


def test_a_symlinked_folder_pointing_outside_the_root_is_refused(root, tmp_path):
    outside = fake_environment(tmp_path, "elsewhere")
    (root / "escape").symlink_to(outside)
    with pytest.raises(BadEnvironment) as caught:
        envs.resolve(root, "escape")
    assert str(caught.value) == f"environment escape is a symbolic link to {outside}, outside ENVIRONMENTS_ROOT"
    (root / "itself").symlink_to(".")
    with pytest.raises(BadEnvironment, match="outside ENVIRONMENTS_ROOT"):
        envs.resolve(root, "itself")
    assert [env.name for env in envs.list_environments(root)] == ["alpha", "beta"]


def test_a_symlink_to_another_environment_inside_is_an_alias(root):
    (root / "latest").symlink_to("beta")
    latest = envs.resolve(root, "latest")
    assert (latest.name, latest.root) == ("latest", root / "beta")
    (root / "dangling").symlink_to("nothing-here")
    with pytest.raises(BadEnvironment) as caught:
        envs.resolve(root, "dangling")
    assert str(caught.value) == "environment dangling does not exist (a dangling link)"


def test_other_entries_are_not_environments(root):
    (root / "notes.txt").write_text("x")
    (root / ".building-gamma-x1y2").mkdir()
    fake_environment(root, ".building-delta-abcd")  # a complete-looking but unfinished build
    fake_environment(root, "Upper")
    assert [env.name for env in envs.list_environments(root)] == ["alpha", "beta"]
    with pytest.raises(BadEnvironment, match="notes.txt is not a folder"):
        envs.resolve(root, "notes.txt")


def test_a_folder_the_sandbox_uids_cannot_enter_is_refused(root):
    os.chmod(root / "beta", 0o700)
    with pytest.raises(BadEnvironment) as caught:
        envs.resolve(root, "beta")
    assert (
        str(caught.value)
        == "environment beta: its folder is mode 0700; the sandbox uids need to read and enter it (0755)"
    )


def test_find_interpreter_searches_like_path_inside_the_environment(root):
    tree = root / "alpha"
    assert envs.find_interpreter(tree, "python3") is None
    executable(tree / "usr" / "bin" / "python3.11")
    (tree / "usr" / "bin" / "python3").symlink_to("python3.11")
    assert envs.find_interpreter(tree, "python3") == "/usr/bin/python3"
    executable(tree / "usr" / "local" / "bin" / "python3")
    assert envs.find_interpreter(envs.resolve(root, "alpha"), "python3") == "/usr/local/bin/python3"
    (tree / "usr" / "bin" / "bash").symlink_to("/usr/bin/missing")  # dangling inside, though the host has bash
    assert envs.find_interpreter(tree, "bash") is None
    executable(tree / "usr" / "bin" / "node").chmod(0o644)
    assert envs.find_interpreter(tree, "node") is None


# -- versions -----------------------------------------------------------------------------


def test_python_and_node_from_dpkg(root):
    tree = root / "alpha"
    executable(tree / "usr" / "bin" / "python3.11")
    (tree / "usr" / "bin" / "python3").symlink_to("python3.11")
    executable(tree / "usr" / "bin" / "node")
    dpkg_status(
        tree,
        {"python3.11-minimal": "3.11.2-6+deb12u6", "python3": "3.11.2-1+b1", "nodejs": "18.19.0+dfsg-6~deb12u2"},
        removed=("python3.12-minimal",),
    )
    env = envs.resolve(root, "alpha")
    assert (env.python, env.node) == ("3.11.2", "18.19.0")
    assert envs.runtimes(tree) == {"python": "3.11.2", "node": "18.19.0"}


def test_the_official_docker_images_layout_from_headers(root):
    """python:3.12 and node:20 install under /usr/local, with their headers and no dpkg entry."""
    tree = root / "beta"
    executable(tree / "usr" / "local" / "bin" / "python3.12")
    (tree / "usr" / "local" / "bin" / "python3").symlink_to("python3.12")
    patchlevel = tree / "usr" / "local" / "include" / "python3.12" / "patchlevel.h"
    patchlevel.parent.mkdir(parents=True)
    patchlevel.write_text('#define PY_MINOR_VERSION        12\n#define PY_VERSION              "3.12.4"\n')
    executable(tree / "usr" / "local" / "bin" / "node")
    header = tree / "usr" / "local" / "include" / "node" / "node_version.h"
    header.parent.mkdir(parents=True)
    header.write_text("#define NODE_MAJOR_VERSION 20\n#define NODE_MINOR_VERSION 11\n#define NODE_PATCH_VERSION 1\n")
    dpkg_status(tree, {"python3.11-minimal": "3.11.2-6"})  # Debian's own python3, shadowed by /usr/local
    env = envs.resolve(root, "beta")
    assert (env.python, env.node) == ("3.12.4", "20.11.1")


def test_the_file_name_is_the_last_resort(root):
    tree = root / "alpha"
    executable(tree / "usr" / "bin" / "python3.13")
    (tree / "usr" / "bin" / "python3").symlink_to("python3.13")
    executable(tree / "usr" / "bin" / "node")  # no header, no package: unknown, not guessed
    assert envs.runtimes(tree) == {"python": "3.13", "node": None}


def test_the_hosts_runtimes_are_what_path_would_run():
    path = "/usr/local/bin:/usr/bin:/bin"
    expected = {}
    for name, key in (("python3", "python"), ("node", "node")):
        found = shutil.which(name, path=path)
        if found is None:
            expected[key] = None
            continue
        shown = subprocess.run([found, "--version"], capture_output=True, text=True, check=True).stdout
        expected[key] = re.search(r"[0-9]+\.[0-9]+\.[0-9]+", shown).group(0)
    assert envs.runtimes() == expected
    assert expected["python"] is not None


# -- identity and choice ------------------------------------------------------------------


def test_identity_is_stable_and_changes_when_the_tree_is_rebuilt_or_replaced(root):
    first = envs.resolve(root, "alpha").identity
    assert envs.resolve(root, "alpha").identity == first
    assert first != envs.resolve(root, "beta").identity
    (root / "alpha" / envs.STAMP_FILE).write_text('{"id": "build-2"}')
    stamped = envs.resolve(root, "alpha").identity
    assert stamped != first
    dpkg_status(root / "alpha", {"python3": "3.11.2-1"})  # apt-get install into it
    installed = envs.resolve(root, "alpha").identity
    assert installed != stamped
    shutil.rmtree(root / "alpha")
    fake_environment(root, "alpha")
    assert envs.resolve(root, "alpha").identity not in (first, stamped, installed)


def task_naming(tmp_path, environment: str | None):
    folder = tmp_path / f"task-{environment}"
    folder.mkdir()
    named = f"environment: {environment}\n" if environment else ""
    (folder / "workspace.yaml").write_text(f"repo: https://example.com/r.git\nbase_commit: abc123\n{named}")
    (folder / "prompt.md").write_text("do it\n")
    return load_task(folder)


def test_choose_environment(root, tmp_path):
    config = Config(environments_root=root)
    plain, beta, gamma = (task_naming(tmp_path, name) for name in (None, "beta", "gamma"))
    assert choose_environment(config, plain) is None
    assert choose_environment(config, beta).name == "beta"
    config = dataclasses.replace(config, default_environment="alpha")
    assert choose_environment(config, plain).name == "alpha"
    assert choose_environment(config, beta).name == "beta"
    with pytest.raises(UnknownEnvironment, match=re.escape("unknown environment: gamma (available: alpha, beta)")):
        choose_environment(config, gamma)
    assert choose_environment(Config(), plain) is None
