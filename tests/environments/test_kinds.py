"""The three kinds of environment behind one interface (environments/kinds.py): what each binds, mounts
as its root, puts on PATH and names as the working directory. The pipeline's tests run them for real."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from evaluations.environments import BadEnvironment, Environment, kinds
from evaluations.pipeline.session import Session
from evaluations.runtime.idmap import IdMap
from evaluations.runtime.sandbox import SYSTEM_PATH
from evaluations.runtime.types import ImageRoot

SPAWNER = SimpleNamespace(runtime=SimpleNamespace(command_path=lambda: "/opt/runtimes/bin:" + SYSTEM_PATH))


def _session(tmp_path: Path) -> Session:
    session = Session(tmp_path / "session", uid=None)
    for folder in (session.repo, session.home, session.tmp, session.venv):
        folder.mkdir(parents=True)
    return session


def _image(tmp_path: Path, session: Session, *, in_workdir: bool, config: dict) -> kinds.Image:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir(exist_ok=True)
    mounted = ImageRoot(rootfs=rootfs, idmap=IdMap(lease=200_000, base=300_000))
    return kinds.Image(
        session,
        SPAWNER,
        ref="python:3.12",
        digest="sha256:" + "ab" * 32,
        config=config,
        mounted=mounted,
        store=None,
        in_workdir=in_workdir,
    )


def test_the_host_and_a_named_environment_bind_the_venv_an_image_does_not(tmp_path):
    session = _session(tmp_path)
    named = kinds.Named(session, SPAWNER, Environment("debian", tmp_path / "root", "id", "3.11.2", None))
    image = _image(tmp_path, session, in_workdir=False, config={})
    host = kinds.Host(session, SPAWNER)
    folders = (session.repo, session.home, session.tmp)
    assert host.sandbox_policy(network=False).writable == (*folders, session.venv)
    assert named.sandbox_policy(network=False).writable == (*folders, session.venv)
    assert image.sandbox_policy(network=False).writable == folders
    assert (host.sandbox_policy(network=False).root, host.sandbox_policy(network=False).image) == (None, None)
    assert (named.sandbox_policy(network=False).root, named.sandbox_policy(network=False).image) == (
        tmp_path / "root",
        None,
    )
    assert image.sandbox_policy(network=False).image is image.mounted
    assert (host.cache_key(), named.cache_key(), image.cache_key()) == (
        None,
        ["debian", "id"],
        ["python:3.12", "ab" * 12],
    )


def test_each_kinds_path_and_variables(tmp_path):
    session = _session(tmp_path)
    host = kinds.Host(session, SPAWNER)
    named = kinds.Named(session, SPAWNER, Environment("debian", tmp_path / "root", "id", None, None))
    image = _image(tmp_path, session, in_workdir=False, config={"Env": ["PATH=/usr/local/bin:/usr/bin", "A=b=c", 3]})
    assert (host.command_path, named.command_path) == ("/opt/runtimes/bin:" + SYSTEM_PATH, SYSTEM_PATH)
    assert image.variables() == {"PATH": "/usr/local/bin:/usr/bin", "A": "b=c"}
    env = image.command_env(None)
    assert env["PATH"] == "/usr/local/bin:/usr/bin" and "VIRTUAL_ENV" not in env and env["A"] == "b=c"
    assert env["HOME"] == str(session.home) and env["TMPDIR"] == str(session.tmp)
    assert _image(tmp_path, session, in_workdir=False, config={}).command_path == SYSTEM_PATH


def test_the_working_directory_is_the_repository_unless_an_image_task_has_none(tmp_path):
    session = _session(tmp_path)
    assert kinds.Host(session, SPAWNER).workdir == str(session.repo)
    assert _image(tmp_path, session, in_workdir=False, config={"WorkingDir": "/app"}).workdir == str(session.repo)
    image = _image(tmp_path, session, in_workdir=True, config={"WorkingDir": "/app"})
    assert image.workdir == "/app"
    assert _image(tmp_path, session, in_workdir=True, config={}).workdir == "/"
    with pytest.raises(BadEnvironment, match="the image's WorkingDir /app is gone"):
        image.open_workdir()
    os.symlink("/", image.root / "app")  # followed inside the image's root: its `/`
    fd = image.open_workdir()
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(image.root))
    finally:
        os.close(fd)
