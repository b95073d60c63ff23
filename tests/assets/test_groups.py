"""Flat and grouped declarations, the executor < task < submission merge, the config file."""

from __future__ import annotations

import pytest

from assets.groups import load_config_file, merge, resolve
from assets.model import AssetError


def res(declared, root, origin="task"):
    return resolve(declared, root, base_label="the task folder", origin=origin)


def test_a_flat_mapping_is_one_group(root):
    group = res({"spec": {"path": "specs/api.yaml"}, "corpus": {"path": "corpora/en", "save_path": "data"}}, root)
    assert [(a.name, a.save_path, a.origin) for a in group.values()] == [
        ("spec", "specs/api.yaml", "task"),
        ("corpus", "data", "task"),
    ]


def test_nothing_declared_is_no_assets(root):
    assert res(None, root) == {} and res({}, root) == {}


def test_named_groups_combine_in_ordering_and_a_later_one_wins_by_name(root):
    declared = {
        "ordering": ["base", "override"],
        "override": {"corpus": {"path": "corpora/en/sub", "save_path": "data"}},
        "base": {"corpus": {"path": "corpora/en", "save_path": "data"}, "spec": {"path": "specs/api.yaml"}},
    }
    group = res(declared, root)
    assert group["corpus"].source == root / "corpora" / "en" / "sub"
    assert list(group) == ["spec", "corpus"]
    declared["ordering"] = ["override", "base"]
    assert res(declared, root)["corpus"].source == root / "corpora" / "en"


def test_an_empty_named_group_is_allowed(root):
    assert list(res({"ordering": ["a", "b"], "a": {}, "b": {"spec": {"path": "specs/api.yaml"}}}, root)) == ["spec"]


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"spec": {"path": "specs/api.yaml"}, "extra": {"c": {"path": "corpora/en"}}},
         "task static assets mix assets and named groups: 'spec' is an asset, 'extra' is a group"),
        ({"ordering": ["g"], "g": {"c": {"path": "corpora/en"}}, "spec": {"path": "specs/api.yaml"}},
         "task static assets mix assets and named groups: 'spec' is an asset, 'g' is a group"),
        ({"ordering": ["g", "nope"], "g": {"c": {"path": "corpora/en"}}},
         "task static assets: 'ordering' names 'nope', which is not a group"),
        ({"ordering": ["spec"], "spec": {"path": "specs/api.yaml"}},
         "task static assets: 'ordering' is given but there are no named groups ('spec' is an asset)"),
        ({"ordering": []}, "task static assets: 'ordering' is given but there are no named groups"),
        ({"ordering": ["g"], "g": {"c": {"path": "corpora/en"}}, "h": {"d": {"path": "specs"}}},
         "task static assets: group 'h' is not in 'ordering'"),
        ({"ordering": ["g", "g"], "g": {"c": {"path": "corpora/en"}}},
         "task static assets: 'ordering' names 'g' twice"),
        ({"ordering": "g", "g": {"c": {"path": "corpora/en"}}},
         "task static assets: 'ordering' must be a list of group names"),
        ({"g": {"c": {"path": "corpora/en"}}, "h": {"d": {"path": "specs"}}},
         "task static assets: named groups ('g', 'h') need an 'ordering' list saying which wins"),
        (["spec"], "task static assets must be a mapping of names to assets"),
        ({"a": {"path": "specs"}, "b": {"path": "corpora/en", "save_path": "specs"}},
         "static assets 'a' and 'b' have the same save_path 'specs'"),
        ({"ordering": ["g", "h"], "g": {"a": {"path": "specs"}}, "h": {"b": {"path": "corpora/en", "save_path": "specs"}}},
         "static assets 'a' and 'b' have the same save_path 'specs'"),
        ({"ordering": ["g"], "g": {"a": {"path": "../x"}}}, "static asset 'a': 'path' must not contain a '..' component"),
    ],
)  # fmt: skip
def test_shapes_that_are_refused(root, declared, message):
    with pytest.raises(AssetError) as caught:
        res(declared, root)
    assert message in str(caught.value)


def test_too_many_assets(root):
    with pytest.raises(AssetError, match="at most 256 may be declared, got 257"):
        res({f"a{i}": {"path": "specs", "save_path": f"s{i}"} for i in range(257)}, root)


def test_merge_executor_task_submission_later_wins_by_name(root):
    executor = res({"corpus": {"path": "corpora/en", "save_path": "data"}, "spec": {"path": "specs"}}, root, "executor")
    task = res({"corpus": {"path": "corpora/en/sub", "save_path": "data"}}, root, "task")
    submission = res({"spec": {"path": "specs/api.yaml", "save_path": "api.yaml"}}, root, "submission")
    merged = {a.name: a for a in merge(executor, task, submission)}
    assert (merged["corpus"].origin, merged["corpus"].source) == ("task", root / "corpora" / "en" / "sub")
    assert (merged["spec"].origin, merged["spec"].save_path) == ("submission", "api.yaml")


def test_merge_refuses_a_save_path_taken_by_another_group(root):
    executor = res({"corpus": {"path": "corpora/en", "save_path": "data"}}, root, "executor")
    task = res({"other": {"path": "specs", "save_path": "data/specs"}}, root, "task")
    with pytest.raises(AssetError, match="'save_path' 'data/specs' is inside the save_path 'data' of static asset 'corpus'"):  # fmt: skip
        merge(executor, task)


def test_config_file_flat_and_grouped(root, tmp_path):
    flat = tmp_path / "assets.yaml"
    flat.write_text("corpus:\n  path: corpora/en\n  save_path: data/corpus\nspec: {path: specs/api.yaml}\n")
    assert [(a.name, a.save_path, a.origin) for a in load_config_file(flat, root)] == [
        ("corpus", "data/corpus", "executor"),
        ("spec", "specs/api.yaml", "executor"),
    ]
    grouped = tmp_path / "grouped.yaml"
    grouped.write_text(
        "ordering: [common, site]\n"
        "common:\n  corpus: {path: corpora/en}\n"
        "site:\n  corpus: {path: corpora/en/sub, save_path: corpora/en}\n"
    )
    (corpus,) = load_config_file(grouped, root)
    assert corpus.source == root / "corpora" / "en" / "sub"
    empty = tmp_path / "none.yaml"
    empty.write_text("{}\n")
    assert load_config_file(empty, root) == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty; write {} for no assets"),
        ("corpus: {path: [\n", "is not valid YAML (line"),
        ("corpus: !!python/object:os.system {}\n", "is not valid YAML"),
        ("corpus: {path: ../etc}\n", "static asset 'corpus': 'path' must not contain a '..' component"),
        ("corpus: {path: escape}\n", "static asset 'corpus': 'path' 'escape' resolves outside STATIC_ASSETS_ROOT"),
        ("corpus: {path: nope}\n", "static asset 'corpus': 'path' 'nope' does not exist in STATIC_ASSETS_ROOT"),
        ("- a\n- b\n", "executor static assets must be a mapping"),
    ],
)
def test_a_bad_config_file_names_the_problem(root, tmp_path, text, message):
    path = tmp_path / "assets.yaml"
    path.write_text(text)
    with pytest.raises(AssetError) as caught:
        load_config_file(path, root)
    assert message in str(caught.value)
