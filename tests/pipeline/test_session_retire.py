"""A session folder leaves its place at cleanup in one rename; its removal follows the final state."""

from __future__ import annotations

import os
import uuid

import pytest

from evaluations.pipeline.session import RETIRED_PREFIX, Session, remove_retired
from evaluations.runtime import sandbox_uid
from evaluations.worker import reaper

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


@pytest.mark.django_db
def test_the_reaper_removes_retired_folders_a_dead_process_left_but_not_fresh_ones(tmp_path, monkeypatch):
    base = tmp_path / "sessions"
    first, second = _session(base).retire(), _session(base).retire()
    not_ours = base / f"{RETIRED_PREFIX}not-an-eval-id"
    not_ours.mkdir()
    # Within the grace its own evaluation process may be removing it: left alone.
    assert reaper.remove_orphan_folders(base) == (0, 0)
    assert first.exists() and second.exists()
    monkeypatch.setattr(reaper, "RETIRED_GRACE_SECS", -1.0)  # ctime cannot be set back: shorten the grace
    assert reaper.remove_orphan_folders(base, dry_run=True) == (2, 0)
    assert first.exists() and second.exists()
    assert reaper.remove_orphan_folders(base) == (2, 0)
    assert sorted(p.name for p in base.iterdir()) == [not_ours.name]
