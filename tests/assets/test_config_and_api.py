"""The executor group at start (STATIC_ASSETS_CONFIG), GET /assets, /status, and submission assets in POST /evaluate."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from assets.groups import load_config_file
from evaluations.models import Evaluation
from executor_project.config import ConfigError
from executor_project.settings_loader import load
from tests.helpers.service import PROJECT

GOOD = {"agent_code": "print('hi')", "task_url": "https://example.com/task.tar.gz"}


@pytest.fixture
def config_file(root, tmp_path):
    path = tmp_path / "assets.yaml"
    path.write_text("corpus: {path: corpora/en, save_path: data/corpus}\nspec: {path: specs/api.yaml}\n")
    return path


def test_the_executor_group_is_loaded_at_start(root, config_file):
    config = load({"STATIC_ASSETS_ROOT": str(root), "STATIC_ASSETS_CONFIG": str(config_file)})
    assert [(a.name, a.save_path, a.kind, a.origin) for a in config.static_assets] == [
        ("corpus", "data/corpus", "dir", "executor"),
        ("spec", "specs/api.yaml", "file", "executor"),
    ]
    assert load({"STATIC_ASSETS_ROOT": str(root)}).static_assets == ()


def test_a_bad_config_file_is_a_config_error_naming_the_asset(root, tmp_path):
    path = tmp_path / "assets.yaml"
    path.write_text("corpus: {path: corpora/en}\nleak: {path: escape}\n")
    with pytest.raises(ConfigError) as caught:
        load({"STATIC_ASSETS_ROOT": str(root), "STATIC_ASSETS_CONFIG": str(path)})
    assert str(caught.value) == (
        "STATIC_ASSETS_CONFIG: static asset 'leak': 'path' 'escape' resolves outside STATIC_ASSETS_ROOT "
        "through a symbolic link"
    )


@pytest.mark.slow
def test_a_bad_config_file_stops_start_up_with_one_line(root, tmp_path):
    path = tmp_path / "assets.yaml"
    path.write_text("corpus: {path: corpora/missing}\n")
    env = {"PATH": "/usr/bin:/bin", "DATA_DIR": str(tmp_path / "data"), "STATIC_ASSETS_ROOT": str(root),
           "STATIC_ASSETS_CONFIG": str(path)}  # fmt: skip
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=PROJECT, env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == (
        "term-executor: configuration error: STATIC_ASSETS_CONFIG: static asset 'corpus': "
        "'path' 'corpora/missing' does not exist in STATIC_ASSETS_ROOT\n"
    )


@pytest.fixture
def with_assets(executor_config, root, config_file):
    return executor_config(static_assets_root=root, static_assets_config=config_file,
                           static_assets=load_config_file(config_file, root))  # fmt: skip


@pytest.mark.django_db
def test_get_assets_lists_the_executor_group(api, with_assets):
    assert api.get("/assets").json() == [
        {"name": "corpus", "save_path": "data/corpus", "kind": "dir", "size_bytes": len("alpha\nbeta\ngamma\n")},
        {"name": "spec", "save_path": "specs/api.yaml", "kind": "file", "size_bytes": len("openapi: 3.0.0\n")},
    ]


@pytest.mark.django_db
def test_get_assets_needs_the_token(api, with_assets, executor_config):
    executor_config(auth_tokens=("tok",))
    assert api.get("/assets").status_code == 401
    assert api.get("/assets", HTTP_AUTHORIZATION="Bearer tok").status_code == 200


@pytest.mark.django_db
def test_no_executor_assets(api):
    assert api.get("/assets").json() == []
    assert api.get("/status").json()["static_assets"] == 0


@pytest.mark.django_db
def test_status_counts_the_executor_group(api, with_assets):
    assert api.get("/status").json()["static_assets"] == 2


def post(api, static_assets):
    return api.post("/evaluate", data=json.dumps({**GOOD, "static_assets": static_assets}), content_type="application/json")  # fmt: skip


@pytest.mark.django_db
def test_a_good_submission_group_is_stored_as_sent(api, with_assets):
    sent = {"words": {"path": "corpora/en/words.txt", "save_path": "./words//w.txt"}}
    response = post(api, sent)
    assert response.status_code == 202, response.content
    assert Evaluation.objects.get(id=response.json()["eval_id"]).static_assets == sent


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("sent", "message"),
    [
        ({"a": {"path": "../x"}}, "static asset 'a': 'path' must not contain a '..' component, got '../x'"),
        ({"a": {"path": "escape"}}, "static asset 'a': 'path' 'escape' resolves outside STATIC_ASSETS_ROOT through a symbolic link"),
        ({"a": {"path": "nope"}}, "static asset 'a': 'path' 'nope' does not exist in STATIC_ASSETS_ROOT"),
        ({"a": {"save_path": "x"}}, "static asset 'a': missing 'path'"),
        ({"a": {"path": "specs", "save_path": ".git/x"}}, "static asset 'a': 'save_path' '.git/x' collides with the repository's .git"),
        ({"a": {"path": "specs", "save_path": "data/corpus/x"}}, "static asset 'a': 'save_path' 'data/corpus/x' is inside the save_path 'data/corpus' of static asset 'corpus'"),
        ({"ordering": ["g"], "a": {"path": "specs"}}, "submission static assets: 'ordering' is given but there are no named groups ('a' is an asset)"),
    ],
)  # fmt: skip
def test_a_bad_submission_group_is_400_naming_the_asset(api, with_assets, sent, message):
    response = post(api, sent)
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid_request" and body["fields"]["static_assets"] == [message]
    assert Evaluation.objects.count() == 0


@pytest.mark.django_db
def test_submission_assets_need_a_root(api):
    response = post(api, {"a": {"path": "x"}})
    assert response.status_code == 400
    assert response.json()["fields"]["static_assets"] == [
        "static asset 'a': STATIC_ASSETS_ROOT is not set, so there is no folder to take it from"
    ]
    assert post(api, {}).status_code == 202
