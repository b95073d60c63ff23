"""One asset's rules: every refusal names the asset and the rule."""

from __future__ import annotations

import os

import pytest

from assets.model import Asset, AssetError, check_together, env_name, normalise, parse_asset


def parse(name, spec, root):
    return parse_asset(name, spec, root, base_label="STATIC_ASSETS_ROOT", origin="executor")


def test_a_file_and_a_folder_resolve_to_real_sources(root):
    spec = parse("spec", {"path": "specs/api.yaml", "save_path": "docs/api.yaml"}, root)
    assert spec == Asset("spec", "specs/api.yaml", "docs/api.yaml", root / "specs" / "api.yaml", "file", "executor")
    corpus = parse("corpus", {"path": "corpora/en"}, root)
    assert (corpus.save_path, corpus.kind, corpus.source) == ("corpora/en", "dir", root / "corpora" / "en")


def test_save_path_defaults_to_path_and_null_means_default(root):
    assert parse("a", {"path": "specs/api.yaml", "save_path": None}, root).save_path == "specs/api.yaml"


def test_a_link_that_stays_inside_the_base_is_followed(root):
    asset = parse("a", {"path": "inside_link"}, root)
    assert (asset.source, asset.kind, asset.save_path) == (root / "specs" / "api.yaml", "file", "inside_link")


def test_a_base_that_is_itself_a_link_is_fine(root, tmp_path):
    (tmp_path / "root-link").symlink_to(root)
    assert parse("a", {"path": "specs/api.yaml"}, tmp_path / "root-link").source == root / "specs" / "api.yaml"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"path": "/etc/passwd"}, "static asset 'a': 'path' must be a relative path, got the absolute path '/etc/passwd'"),
        ({"path": "specs/api.yaml", "save_path": "/srv/x"}, "static asset 'a': 'save_path' must be a relative path, got the absolute path '/srv/x'"),
        ({"path": "../secret.txt"}, "static asset 'a': 'path' must not contain a '..' component, got '../secret.txt'"),
        ({"path": "specs/../../secret.txt"}, "static asset 'a': 'path' must not contain a '..' component"),
        ({"path": "specs/api.yaml", "save_path": "x/../../y"}, "static asset 'a': 'save_path' must not contain a '..' component"),
        ({"path": "specs/api.yaml", "save_path": ".."}, "static asset 'a': 'save_path' must not contain a '..' component"),
        ({"path": "escape"}, "static asset 'a': 'path' 'escape' resolves outside STATIC_ASSETS_ROOT through a symbolic link"),
        ({"path": "escape_dir/secret.txt"}, "static asset 'a': 'path' 'escape_dir/secret.txt' resolves outside STATIC_ASSETS_ROOT"),
        ({"path": "dangling_out"}, "static asset 'a': 'path' 'dangling_out' resolves outside STATIC_ASSETS_ROOT"),
        ({"path": "missing.txt"}, "static asset 'a': 'path' 'missing.txt' does not exist in STATIC_ASSETS_ROOT"),
        ({"path": ""}, "static asset 'a': 'path' must be a non-empty string, got ''"),
        ({"path": 5}, "static asset 'a': 'path' must be a non-empty string, got a number"),
        ({"path": ["x"]}, "static asset 'a': 'path' must be a non-empty string, got a list"),
        ({"path": None}, "static asset 'a': 'path' must be a non-empty string, got nothing"),
        ({}, "static asset 'a': missing 'path'"),
        ({"save_path": "x"}, "static asset 'a': missing 'path'"),
        ({"path": "specs/api.yaml", "save_path": ""}, "static asset 'a': 'save_path' must be a non-empty string"),
        ({"path": "specs/api.yaml", "save_path": 3}, "static asset 'a': 'save_path' must be a non-empty string, got a number"),
        ({"path": "specs/api.yaml", "mode": "rw"}, "static asset 'a': unknown key 'mode'"),
        ({"path": "specs/api.yaml", "save_path": ".git"}, "static asset 'a': 'save_path' '.git' collides with the repository's .git"),
        ({"path": "specs/api.yaml", "save_path": ".git/hooks/post-checkout"}, "collides with the repository's .git"),
        ({"path": "specs/api.yaml", "save_path": "./.GIT/config"}, "'save_path' '.GIT/config' collides with the repository's .git"),
        ({"path": "specs/api.yaml", "save_path": "vendor/.git"}, "collides with the repository's .git"),
        ({"path": "specs/api.yaml", "save_path": "bad\nname"}, "static asset 'a': 'save_path' must not contain control characters"),
        ({"path": "."}, "static asset 'a': 'path' '.' names the whole base folder"),
        ({"path": "specs/api.yaml", "save_path": "."}, "static asset 'a': 'save_path' '.' names the repository itself"),
        ({"path": "specs/api.yaml", "save_path": "./"}, "static asset 'a': 'save_path' './' names the repository itself"),
        ("specs/api.yaml", "static asset 'a' must be a mapping with 'path' (and optionally 'save_path'), got 'specs/api.yaml'"),
    ],
)  # fmt: skip
def test_refusals_name_the_asset_and_the_rule(root, spec, message):
    with pytest.raises(AssetError) as caught:
        parse("a", spec, root)
    assert message in str(caught.value)


def test_a_fifo_is_not_an_asset(root):
    os.mkfifo(root / "pipe")
    with pytest.raises(AssetError, match="'path' 'pipe' is neither a regular file nor a folder"):
        parse("a", {"path": "pipe"}, root)


def test_no_base_configured(root):
    with pytest.raises(AssetError, match="static asset 'a': STATIC_ASSETS_ROOT is not set"):
        parse_asset("a", {"path": "x"}, None, base_label="STATIC_ASSETS_ROOT")


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("./x/./y", "x/y"),
        ("dir/", "dir"),
        ("a..b", "a..b"),
        ("x//y", "x/y"),
        ("...", "..."),
        (".hidden/file", ".hidden/file"),
        ("a b/c", "a b/c"),
    ],
)
def test_save_path_normalisation(raw, normalised):
    assert normalise(raw, asset="a", key="save_path") == normalised


def test_save_path_edge_cases_end_to_end(root):
    assert parse("a", {"path": "corpora/en", "save_path": "./x/./y"}, root).save_path == "x/y"
    assert parse("a", {"path": "corpora/en/", "save_path": "dir/"}, root).save_path == "dir"
    assert parse("a", {"path": "corpora/en", "save_path": "a..b"}, root).save_path == "a..b"


@pytest.mark.parametrize("name", ["corpus", "my-corpus", "v1.2", "_x", "A9"])
def test_good_names(root, name):
    assert parse(name, {"path": "specs/api.yaml"}, root).name == name


@pytest.mark.parametrize("name", ["", "-x", ".x", "a b", "a/b", "a{b}", "ünï", 5, None, "x" * 101])
def test_bad_names(root, name):
    with pytest.raises(AssetError, match="static asset name .* must be"):
        parse(name, {"path": "specs/api.yaml"}, root)


@pytest.mark.parametrize(
    ("name", "variable"),
    [("corpus", "STATIC_ASSET_CORPUS"), ("my-corpus", "STATIC_ASSET_MY_CORPUS"), ("v1.2", "STATIC_ASSET_V1_2"),
     ("Mixed_Case", "STATIC_ASSET_MIXED_CASE")],
)  # fmt: skip
def test_variable_names(name, variable):
    assert env_name(name) == variable


def _asset(name, save_path):
    return Asset(name, save_path, save_path, None, "file")


def test_two_assets_with_one_save_path_are_refused():
    with pytest.raises(AssetError, match="static assets 'a' and 'b' have the same save_path 'data'"):
        check_together([_asset("a", "data"), _asset("b", "data")])


def test_an_asset_inside_another_is_refused():
    with pytest.raises(AssetError, match="static asset 'b': 'save_path' 'data/x' is inside the save_path 'data' of static asset 'a'"):  # fmt: skip
        check_together([_asset("a", "data"), _asset("b", "data/x")])
    check_together([_asset("a", "data"), _asset("b", "data2/x"), _asset("c", "dat")])  # prefixes of names are fine


def test_two_names_giving_one_variable_are_refused():
    with pytest.raises(AssetError, match="static assets 'my-corpus' and 'my_corpus' both give the variable STATIC_ASSET_MY_CORPUS"):  # fmt: skip
        check_together([_asset("my-corpus", "a"), _asset("my_corpus", "b")])
    with pytest.raises(AssetError, match="STATIC_ASSET_CORPUS"):
        check_together([_asset("corpus", "a"), _asset("Corpus", "b")])
