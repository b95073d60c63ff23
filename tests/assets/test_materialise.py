"""Copying assets into a folder that may hold planted links, from a source that may hold links too."""

from __future__ import annotations

import os
import stat

import pytest

from assets.materialise import copy_asset, link_asset, tree_bytes
from assets.model import AssetError, parse_asset

OWNER = 65534 if os.geteuid() == 0 else None


def asset(root, path, save_path=None, name="a"):
    spec = {"path": path} if save_path is None else {"path": path, "save_path": save_path}
    return parse_asset(name, spec, root, base_label="STATIC_ASSETS_ROOT", origin="executor")


@pytest.fixture
def repo(tmp_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    return folder


def test_a_file_lands_at_its_save_path_with_parents_created(root, repo):
    copied = copy_asset(asset(root, "specs/api.yaml", "docs/v1/api.yaml"), repo, owner=OWNER)
    target = repo / "docs" / "v1" / "api.yaml"
    assert target.read_text() == "openapi: 3.0.0\n" and copied == len("openapi: 3.0.0\n")
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert stat.S_IMODE((repo / "docs").stat().st_mode) == 0o755
    if OWNER is not None:
        assert {target.stat().st_uid, (repo / "docs").stat().st_uid, (repo / "docs" / "v1").stat().st_uid} == {OWNER}
        assert repo.stat().st_uid == 0  # an existing folder is not taken over


def test_an_executable_stays_executable(root, repo):
    copy_asset(asset(root, "tool.sh"), repo, owner=None)
    assert stat.S_IMODE((repo / "tool.sh").stat().st_mode) == 0o755


def test_a_folder_is_copied_recursively(root, repo):
    copied = copy_asset(asset(root, "corpora/en", "data/corpus"), repo, owner=OWNER)
    assert (repo / "data" / "corpus" / "words.txt").read_text() == "alpha\nbeta\n"
    assert (repo / "data" / "corpus" / "sub" / "more.txt").read_text() == "gamma\n"
    assert copied == len("alpha\nbeta\n") + len("gamma\n")
    if OWNER is not None:
        assert (repo / "data" / "corpus" / "sub").stat().st_uid == OWNER
        assert (repo / "data" / "corpus" / "sub" / "more.txt").stat().st_uid == OWNER


def test_links_in_a_folder_are_kept_only_when_they_stay_inside_it(root, repo, tmp_path):
    corpus = root / "corpora" / "en"
    (corpus / "rel_ok").symlink_to("words.txt")
    (corpus / "sub" / "up_ok").symlink_to("../words.txt")
    (corpus / "self").symlink_to(".")
    (corpus / "abs").symlink_to(corpus / "words.txt")  # absolute: would point back at the source
    (corpus / "out").symlink_to("../../../secret.txt")
    (corpus / "sub" / "out_dir").symlink_to("../../..")
    (corpus / "chain").symlink_to("self/../../../secret.txt")
    (corpus / "hosts").symlink_to("/etc/hostname")
    (corpus / "sneaky").symlink_to("self/..")  # lexically inside, really the parent
    copy_asset(asset(root, "corpora/en", "data"), repo, owner=OWNER)
    data = repo / "data"
    assert os.readlink(data / "rel_ok") == "words.txt" and (data / "rel_ok").read_text() == "alpha\nbeta\n"
    assert os.readlink(data / "sub" / "up_ok") == "../words.txt"
    assert os.readlink(data / "self") == "."
    for left_out in ("abs", "out", "chain", "hosts", "sneaky", "sub/out_dir"):
        assert not os.path.lexists(data / left_out), left_out
    copied = [p.read_bytes() for p in data.rglob("*") if p.is_file() and not p.is_symlink()]
    assert all(b"SECRET" not in body for body in copied)


def test_a_link_planted_on_the_way_is_refused_never_written_through(root, repo, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (repo / "docs").symlink_to(outside)
    with pytest.raises(
        AssetError, match="static asset 'a': cannot copy it to 'docs/api.yaml': docs is a symbolic link"
    ):
        copy_asset(asset(root, "specs/api.yaml", "docs/api.yaml"), repo, owner=OWNER)
    assert list(outside.iterdir()) == []


def test_a_file_on_the_way_is_refused(root, repo):
    (repo / "docs").write_text("a file")
    with pytest.raises(AssetError, match="docs is a file"):
        copy_asset(asset(root, "specs/api.yaml", "docs/api.yaml"), repo, owner=OWNER)


def test_a_link_at_the_final_name_is_replaced_not_followed(root, repo, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    (repo / "api.yaml").symlink_to(victim)
    copy_asset(asset(root, "specs/api.yaml", "api.yaml"), repo, owner=OWNER)
    assert not (repo / "api.yaml").is_symlink() and (repo / "api.yaml").read_text() == "openapi: 3.0.0\n"
    assert victim.read_text() == "untouched\n"
    victim_dir = tmp_path / "victim_dir"
    victim_dir.mkdir()
    (repo / "data").symlink_to(victim_dir)
    copy_asset(asset(root, "corpora/en", "data"), repo, owner=OWNER)
    assert (repo / "data").is_dir() and not (repo / "data").is_symlink()
    assert list(victim_dir.iterdir()) == []


def test_a_tracked_file_is_overwritten_and_a_folder_merged(root, repo):
    (repo / "api.yaml").write_text("old\n")
    copy_asset(asset(root, "specs/api.yaml", "api.yaml"), repo, owner=OWNER)
    assert (repo / "api.yaml").read_text() == "openapi: 3.0.0\n"
    (repo / "data").mkdir()
    (repo / "data" / "keep.txt").write_text("mine\n")
    (repo / "data" / "words.txt").write_text("old\n")
    copy_asset(asset(root, "corpora/en", "data"), repo, owner=OWNER)
    assert (repo / "data" / "keep.txt").read_text() == "mine\n"
    assert (repo / "data" / "words.txt").read_text() == "alpha\nbeta\n"


def test_a_file_asset_over_a_folder_is_refused(root, repo):
    (repo / "api.yaml").mkdir()
    with pytest.raises(AssetError, match="cannot copy it to 'api.yaml': api.yaml is a folder"):
        copy_asset(asset(root, "specs/api.yaml", "api.yaml"), repo, owner=OWNER)


def test_the_byte_budget(root, repo):
    with pytest.raises(AssetError, match="static asset 'a': copying it needs more than 5 bytes"):
        copy_asset(asset(root, "corpora/en", "data"), repo, owner=None, max_bytes=5)
    assert not list((repo / "data").rglob(".*asset-*"))  # no temporary file left behind


def test_a_vanished_source_is_named(root, repo):
    spec = asset(root, "specs/api.yaml")
    (root / "specs" / "api.yaml").unlink()
    with pytest.raises(AssetError, match="static asset 'a': cannot read 'specs/api.yaml'"):
        copy_asset(spec, repo, owner=None)


def test_link_asset_makes_a_link_and_replaces_an_old_one(root, repo):
    spec = asset(root, "corpora/en", "x/corpus")
    link_asset(spec, repo, spec.source)
    link_asset(spec, repo, spec.source)
    assert os.readlink(repo / "x" / "corpus") == str(root / "corpora" / "en")


def test_tree_bytes(root):
    assert tree_bytes(root / "specs" / "api.yaml") == len("openapi: 3.0.0\n")
    (root / "corpora" / "en" / "link").symlink_to("words.txt")
    assert tree_bytes(root / "corpora" / "en") == len("alpha\nbeta\n") + len("gamma\n")
