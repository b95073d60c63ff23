"""What one evaluation's commands see: paths, variables, binds, the staging folder."""

from __future__ import annotations

import os
import stat

from assets.groups import merge, resolve
from assets.view import AssetView, stage


def group(declared, base, origin):
    return resolve(declared, base, base_label="base", origin=origin)


def test_under_the_sandbox_everything_is_at_static(root, tmp_path):
    task_root = tmp_path / "task"
    (task_root / "fixtures").mkdir(parents=True)
    (task_root / "fixtures" / "f.json").write_text("{}")
    assets = merge(
        group({"my-corpus": {"path": "corpora/en", "save_path": "data/corpus"}}, root, "executor"),
        group({"fixture": {"path": "fixtures/f.json"}}, task_root, "task"),
    )
    view = stage(assets, tmp_path / "session-static", isolated=True)
    assert view.paths() == {"my-corpus": "/static/data/corpus", "fixture": "/static/fixtures/f.json"}
    assert view.env() == {
        "STATIC_ASSETS_DIR": "/static",
        "STATIC_ASSET_MY_CORPUS": "/static/data/corpus",
        "STATIC_ASSET_FIXTURE": "/static/fixtures/f.json",
    }
    staged = tmp_path / "session-static" / "fixtures" / "f.json"
    assert view.binds() == [
        (root / "corpora" / "en", "/static/data/corpus"),
        (staged, "/static/fixtures/f.json"),  # the task folder is root-only: its staged copy is bound
    ]
    assert view.substitute("cat {{static:fixture}}") == "cat /static/fixtures/f.json"


def test_without_the_sandbox_commands_get_host_paths(root, tmp_path):
    task_root = tmp_path / "task"
    (task_root / "fixtures").mkdir(parents=True)
    (task_root / "fixtures" / "f.json").write_text("{}")
    os.chmod(task_root / "fixtures" / "f.json", 0o600)
    assets = merge(
        group({"corpus": {"path": "corpora/en", "save_path": "data/corpus"}}, root, "executor"),
        group({"fixture": {"path": "fixtures/f.json", "save_path": "f.json"}}, task_root, "task"),
    )
    staging = tmp_path / "session-static"
    view = stage(assets, staging, isolated=False)
    assert view.paths() == {"corpus": str(root / "corpora" / "en"), "fixture": str(staging / "f.json")}
    assert view.env()["STATIC_ASSETS_DIR"] == str(staging)
    assert view.binds() == []
    # $STATIC_ASSETS_DIR/<save_path> works for every asset: a link to an executor one, a copy of a task one.
    assert os.readlink(staging / "data" / "corpus") == str(root / "corpora" / "en")
    assert (staging / "data" / "corpus" / "words.txt").read_text() == "alpha\nbeta\n"
    copy = staging / "f.json"
    assert not copy.is_symlink() and copy.read_text() == "{}"
    assert stat.S_IMODE(copy.stat().st_mode) == 0o644 and copy.stat().st_uid == os.geteuid()  # readable, not theirs
    assert stat.S_IMODE(staging.stat().st_mode) == 0o755


def test_no_assets(tmp_path):
    view = stage((), tmp_path / "static", isolated=True)
    assert (view.paths(), view.binds(), view.env(), view.save_paths) == ({}, [], {"STATIC_ASSETS_DIR": "/static"}, [])
    assert AssetView(staging=tmp_path / "static").env() == {"STATIC_ASSETS_DIR": str(tmp_path / "static")}
