"""The session folder: its folders made one way (owner and mode, never through a link), and its
leaving at cleanup in one rename, its removal after the final state."""

from __future__ import annotations

import os
import uuid

import pytest

from evaluations.pipeline.session import RETIRED_PREFIX, Session, remove_retired
from evaluations.runtime import sandbox_uid

UID = sandbox_uid()


def _session(base, uid=UID):
    session = Session.create(base, str(uuid.uuid4()), uid)
    (session.repo / "deep" / "er").mkdir(parents=True)
    (session.repo / "deep" / "er" / "file").write_text("x")
    return session


def test_retire_moves_the_folder_away_closed_to_the_uid_and_remove_retired_deletes_it(tmp_path):
    base = tmp_path / "sessions"
    session = _session(base)
    retired = session.retire()
    assert not session.root.exists()
    assert retired == base / f"{RETIRED_PREFIX}{session.root.name}"
    st = os.lstat(retired)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (os.geteuid(), os.getegid() if UID is None else 0, 0o700)
    remove_retired(retired)
    assert list(base.iterdir()) == []
    assert session.retire() is None  # nothing left to retire


def test_remove_retired_refuses_a_folder_that_was_not_retired(tmp_path):
    session = _session(tmp_path / "sessions")
    with pytest.raises(ValueError):
        remove_retired(session.root)
    assert (session.repo / "deep" / "er" / "file").exists()


def test_retire_replaces_a_leftover_of_the_same_name_and_never_follows_a_link(tmp_path):
    base = tmp_path / "sessions"
    session = _session(base)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    (base / f"{RETIRED_PREFIX}{session.root.name}").symlink_to(outside)
    retired = session.retire()
    assert retired.is_dir() and not retired.is_symlink()
    assert (outside / "keep").read_text() == "keep"


def test_make_folder_gives_each_folder_its_owner_and_mode_and_refuses_what_stands_there(tmp_path):
    session = _session(tmp_path / "sessions")
    for name, mode, owner, expected in (
        ("owned", 0o755, session.uid_owner, (UID, UID)),
        ("passed", 0o711, session.root_passed, (os.geteuid(), UID)),
        ("shared", 0o777, session.uid_owner, (UID, UID)),
        ("root", 0o700, None, (os.geteuid(), os.getegid())),
    ):
        session.make_folder(session.root / name, mode, owner=owner)
        st = os.lstat(session.root / name)
        assert ((st.st_uid, st.st_gid), st.st_mode & 0o7777) == (expected, mode), name
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (session.repo / "link").symlink_to(target)  # what the agent could plant where a folder goes
    with pytest.raises(FileExistsError):
        session.make_folder(session.repo / "link", 0o777, owner=session.uid_owner)
    st = os.lstat(target)
    assert ((st.st_uid, st.st_gid), st.st_mode & 0o777) == ((os.geteuid(), os.getegid()), 0o700)
