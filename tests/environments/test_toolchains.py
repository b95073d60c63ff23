"""The venv the task's commands get, the interpreter it is made from, their environment (SPEC §11).

Real interpreters and real files; the end-to-end tests with pip and npm are tests/pipeline/test_toolchains_e2e.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from evaluations.environments import toolchains
from evaluations.environments.toolchains import CA_VARIABLES, CaBundle, Python
from evaluations.pipeline.session import Session
from evaluations.runtime import sandbox_uid
from evaluations.runtime.policy import SANDBOX_CA_BUNDLE
from evaluations.runtime.sandbox import SYSTEM_PATH
from executor_project.config import Config, ConfigError, distribution_ca_bundle
from executor_project.settings_loader import load

UID = sandbox_uid()
HOST_PYTHON = toolchains.find_python(SYSTEM_PATH)


def _session(base: Path) -> Session:
    return Session.create(base, str(uuid.uuid4()), UID)


def _tree(folder: Path) -> dict[str, str]:
    """Each entry below ``folder``: a link's target, else its kind."""
    found = {}
    for path in sorted(folder.rglob("*")):
        found[str(path.relative_to(folder))] = os.readlink(path) if path.is_symlink() else path.is_dir() and "dir"
    return found


def _prefix_and_path(python: Path) -> tuple[str, list[str]]:
    code = "import json, sys; print(json.dumps([sys.prefix, sys.path]))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, env={}, cwd="/")
    return tuple(json.loads(done.stdout))


# -- which python3 -------------------------------------------------------------


def test_the_host_python_is_the_one_commands_find_with_its_version():
    assert HOST_PYTHON is not None
    first = next(f"{d}/python3" for d in SYSTEM_PATH.split(":") if os.access(f"{d}/python3", os.X_OK))
    assert HOST_PYTHON.path == first
    done = subprocess.run([first, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True)
    assert HOST_PYTHON.version == done.stdout.decode().strip()


def _fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "local" / "bin").mkdir(parents=True)
    real = root / "usr" / "bin" / "python3.12"
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    return root


def test_links_are_followed_inside_the_root_not_on_the_host(tmp_path):
    root = _fake_root(tmp_path)
    # Absolute: on the host /usr/bin/python3.12 does not exist (3.11 here); inside the root it does.
    (root / "usr" / "local" / "bin" / "python3").symlink_to("/usr/bin/python3.12")
    found = toolchains.find_python("/usr/local/bin:/usr/bin", root)
    assert found == Python("/usr/local/bin/python3", "3.12")
    # Relative, through a linked folder and a "..".
    (root / "usr" / "local" / "bin" / "python3").unlink()
    (root / "opt").symlink_to("/usr/local")
    (root / "usr" / "local" / "bin" / "python3").symlink_to("../../bin/python3.12")
    assert toolchains.find_python("/opt/bin", root) == Python("/opt/bin/python3", "3.12")


def test_the_first_folder_of_the_path_that_has_python3_wins_and_relative_entries_are_skipped(tmp_path):
    root = _fake_root(tmp_path)
    (root / "usr" / "bin" / "python3").symlink_to("python3.12")
    (root / "usr" / "local" / "bin" / "python3").symlink_to("missing3.9")  # dangling: skipped
    (root / "bin").mkdir()
    (root / "bin" / "python3").write_text("not executable")
    assert toolchains.find_python("bin:/nothing:/usr/local/bin:/bin:/usr/bin", root).path == "/usr/bin/python3"


def test_a_version_not_in_the_name_comes_from_the_library_folder(tmp_path):
    root = _fake_root(tmp_path)
    os.rename(root / "usr" / "bin" / "python3.12", root / "usr" / "bin" / "python3")
    assert toolchains.find_python("/usr/bin", root) is None  # no lib/python3.X: no version, no venv
    (root / "usr" / "lib" / "python3.12").mkdir(parents=True)
    (root / "usr" / "lib" / "python3.12" / "os.py").write_text("")
    assert toolchains.find_python("/usr/bin", root) == Python("/usr/bin/python3", "3.12")
    (root / "usr" / "lib" / "python3.13").mkdir()
    (root / "usr" / "lib" / "python3.13" / "os.py").write_text("")
    assert toolchains.find_python("/usr/bin", root) is None  # two candidates: cannot tell


def test_no_python_or_a_link_loop_finds_nothing(tmp_path):
    root = _fake_root(tmp_path)
    assert toolchains.find_python("/usr/local/bin", root) is None
    (root / "usr" / "local" / "bin" / "python3").symlink_to("python3")
    assert toolchains.find_python("/usr/local/bin", root) is None
    assert toolchains.find_python("", root) is None


# -- the venv ------------------------------------------------------------------


def test_the_venv_is_what_python_m_venv_makes_with_pip_launchers_instead_of_activate_scripts(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    toolchains.make_venv(ours, HOST_PYTHON, None)
    subprocess.run(
        [HOST_PYTHON.path, "-m", "venv", "--without-pip", "--system-site-packages", str(theirs)], check=True, env={}
    )
    expected = {k: v for k, v in _tree(theirs).items() if "ctivate" not in k}
    expected.update(dict.fromkeys(["bin/pip", "bin/pip3", f"bin/pip{HOST_PYTHON.version}"], False))
    assert _tree(ours) == expected
    config = dict(line.split(" = ", 1) for line in (ours / "pyvenv.cfg").read_text().splitlines())
    assert config == {"home": os.path.dirname(HOST_PYTHON.path), "include-system-site-packages": "true",
                      "version": HOST_PYTHON.version}  # fmt: skip
    prefix, path = _prefix_and_path(ours / "bin" / "python")
    their_prefix, their_path = _prefix_and_path(theirs / "bin" / "python")
    assert prefix == str(ours)
    assert path == [p.replace(their_prefix, prefix) for p in their_path]


def test_pip_in_the_venv_is_the_interpreters_own_and_installs_into_the_venv(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    toolchains.make_venv(venv, HOST_PYTHON, None)
    env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": str(tmp_path), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for launcher in ("pip", "pip3", f"pip{HOST_PYTHON.version}"):
        done = subprocess.run([launcher, "--version"], capture_output=True, text=True, env=env)
        assert done.returncode == 0 and f"(python {HOST_PYTHON.version})" in done.stdout, done.stderr
    # A local project, no index: what `pip install` writes lands in the venv, not in the system.
    project = tmp_path / "proj"
    (project / "hello_tc").mkdir(parents=True)
    (project / "hello_tc" / "__init__.py").write_text("WORD = 'hi'\n")
    (project / "setup.py").write_text("from setuptools import setup\nsetup(name='hello_tc', packages=['hello_tc'])\n")
    done = subprocess.run(
        ["pip", "install", "--no-index", "--no-build-isolation", "--break-system-packages", str(project)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    site = venv / "lib" / f"python{HOST_PYTHON.version}" / "site-packages"
    assert (site / "hello_tc" / "__init__.py").is_file()
    done = subprocess.run(["python", "-c", "import hello_tc; print(hello_tc.__file__)"], capture_output=True, env=env)
    assert done.stdout.decode().strip() == str(site / "hello_tc" / "__init__.py")


def test_the_pip_launcher_says_what_is_missing_when_the_interpreter_has_no_pip(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    toolchains.make_venv(venv, HOST_PYTHON, None)
    # -S: no site-packages at all, as an interpreter without python3-pip.
    done = subprocess.run([venv / "bin" / "python3", "-S", venv / "bin" / "pip", "install", "x"], capture_output=True)
    assert done.returncode == 1
    assert b"has no pip of its own" in done.stderr and b"python3-pip" in done.stderr
    assert b"Traceback" not in done.stderr


def test_a_venv_is_only_written_into_an_empty_folder(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "planted").symlink_to("/etc")
    with pytest.raises(FileExistsError):
        toolchains.make_venv(venv, HOST_PYTHON, None)
    assert [p.name for p in venv.iterdir()] == ["planted"]


@pytest.mark.skipif(UID is None, reason="needs root to give files to another uid")
def test_the_venv_belongs_to_the_evaluations_uid_the_empty_folder_to_root(tmp_path):
    session = _session(tmp_path / "sessions")
    st = os.lstat(session.venv)
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o755)  # nothing to write before the venv exists
    toolchains.make_session_venv(session, HOST_PYTHON)
    owners = {(os.lstat(p).st_uid, os.lstat(p).st_gid) for p in [session.venv, *session.venv.rglob("*")]}
    assert owners == {(UID, UID)}


def test_no_python_means_no_venv_and_no_virtual_env(tmp_path):
    session = _session(tmp_path / "sessions")
    toolchains.make_session_venv(session, None)
    assert list(session.venv.iterdir()) == []
    env = toolchains.command_env(session, SYSTEM_PATH, None)
    assert "VIRTUAL_ENV" not in env and f"{session.venv}/bin" not in env["PATH"].split(":")


# -- the environment -----------------------------------------------------------


def test_the_environment_puts_the_venv_first_and_every_cache_and_prefix_in_home(tmp_path):
    session = _session(tmp_path / "sessions")
    toolchains.make_session_venv(session, HOST_PYTHON)
    ca = CaBundle(Path("/host/ca.pem"), "/in/sandbox/ca.pem")
    env = toolchains.command_env(session, SYSTEM_PATH, ca)
    home = str(session.home)
    assert env["VIRTUAL_ENV"] == str(session.venv)
    assert env["PATH"].split(":") == [f"{session.venv}/bin", f"{home}/.npm-global/bin", f"{home}/go/bin",
                                      f"{home}/.cargo/bin", *SYSTEM_PATH.split(":")]  # fmt: skip
    for name in ("PIP_CACHE_DIR", "npm_config_cache", "npm_config_prefix", "GOPATH", "GOCACHE", "CARGO_HOME"):
        assert env[name].startswith(home + "/"), name
    assert {name: env[name] for name in CA_VARIABLES} == dict.fromkeys(CA_VARIABLES, "/in/sandbox/ca.pem")
    assert {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS", "npm_config_cafile",
            "GIT_SSL_CAINFO", "CURL_CA_BUNDLE"} <= set(CA_VARIABLES)  # fmt: skip
    assert not set(CA_VARIABLES) & set(toolchains.command_env(session, SYSTEM_PATH, None))


def test_the_ca_bundle_is_ssl_cert_file_else_the_distributions(tmp_path):
    bundle = tmp_path / "corp.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    assert load({"SSL_CERT_FILE": str(bundle)}).ca_bundle == bundle
    given = load({"SSL_CERT_FILE": str(bundle)})
    assert toolchains.host_ca(given, sandboxed=False) == CaBundle(bundle, str(bundle))
    # In a sandbox the bundle is bound at one fixed path, whatever the root and wherever the host keeps it.
    assert toolchains.host_ca(given, sandboxed=True) == CaBundle(bundle, SANDBOX_CA_BUNDLE)
    assert load({}).ca_bundle == distribution_ca_bundle()
    if os.path.isfile("/etc/ssl/certs/ca-certificates.crt"):
        assert load({}).ca_bundle == Path("/etc/ssl/certs/ca-certificates.crt")
    assert toolchains.host_ca(dataclasses.replace(Config(), ca_bundle=None), sandboxed=True) is None


@pytest.mark.parametrize("value", ["/nonexistent/ca.pem", "/etc/ssl/certs"])
def test_an_ssl_cert_file_that_is_not_a_file_stops_start_up_naming_it(value):
    with pytest.raises(ConfigError, match=f"^SSL_CERT_FILE: no such file {value}"):
        load({"SSL_CERT_FILE": value})


# -- kept for the tests --------------------------------------------------------


def test_the_tests_get_the_venv_install_left_whatever_the_agent_did(tmp_path):
    session = _session(tmp_path / "sessions")
    toolchains.make_session_venv(session, HOST_PYTHON)
    site = session.venv / "lib" / f"python{HOST_PYTHON.version}" / "site-packages"
    (site / "installed.py").write_text("X = 1\n")  # what install put there
    session.keep_install_home()
    assert (site / "installed.py").read_text() == "X = 1\n"  # the agent sees it, in its own copy
    if UID is not None:
        assert os.lstat(site / "installed.py").st_uid == UID
    assert os.readlink(session.venv / "bin" / "python3") == HOST_PYTHON.path
    (site / "installed.py").unlink()
    (site / "planted.pth").write_text("import os; os.environ['PLANTED'] = '1'\n")
    session.restore_install_home()
    assert sorted(p.name for p in site.iterdir()) == ["installed.py"]
    assert os.readlink(session.venv / "bin" / "python3") == HOST_PYTHON.path


def test_keeping_and_restoring_without_a_venv_leaves_the_empty_root_owned_folder(tmp_path):
    session = _session(tmp_path / "sessions")
    session.keep_install_home()
    session.restore_install_home()
    assert list(session.venv.iterdir()) == [] and os.lstat(session.venv).st_uid == os.geteuid()
