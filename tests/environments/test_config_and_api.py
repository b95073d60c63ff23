"""ENVIRONMENTS_ROOT and DEFAULT_ENVIRONMENT at start, GET /environments, /status `environments` and `runtimes`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from evaluations import environments as envs
from executor_project.config import ConfigError
from executor_project.settings_loader import load
from tests.helpers.environments import dpkg_status, executable, fake_environment
from tests.helpers.service import PROJECT


@pytest.fixture
def root(tmp_path):
    base = tmp_path / "environments"
    fake_environment(base, "alpha")
    beta = fake_environment(base, "beta")
    executable(beta / "usr" / "bin" / "python3.11")
    (beta / "usr" / "bin" / "python3").symlink_to("python3.11")
    dpkg_status(beta, {"python3.11-minimal": "3.11.2-6+deb12u6"})
    fake_environment(base, "broken", sh=False)  # not listed, not counted
    return base


def test_unset_means_no_environments():
    config = load({})
    assert (config.environments_root, config.default_environment) == (None, None)


def test_the_settings_are_read(root):
    config = load({"ENVIRONMENTS_ROOT": str(root), "DEFAULT_ENVIRONMENT": " beta "})
    assert (config.environments_root, config.default_environment) == (root, "beta")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"ENVIRONMENTS_ROOT": "{root}/missing"}, "ENVIRONMENTS_ROOT: no such folder {root}/missing"),
        ({"ENVIRONMENTS_ROOT": "{root}/alpha/usr/bin/dash"}, "ENVIRONMENTS_ROOT: no such folder {root}/alpha/usr/bin/dash"),
        ({"DEFAULT_ENVIRONMENT": "alpha"}, "DEFAULT_ENVIRONMENT: needs ENVIRONMENTS_ROOT, the folder environments are in"),
        ({"ENVIRONMENTS_ROOT": "{root}", "DEFAULT_ENVIRONMENT": "gamma"}, "DEFAULT_ENVIRONMENT: unknown environment: gamma (available: alpha, beta)"),
        ({"ENVIRONMENTS_ROOT": "{root}", "DEFAULT_ENVIRONMENT": "../alpha"}, "DEFAULT_ENVIRONMENT: environment name '../alpha' must not contain '/'"),
        ({"ENVIRONMENTS_ROOT": "{root}", "DEFAULT_ENVIRONMENT": "broken"}, "DEFAULT_ENVIRONMENT: environment broken has no bin/sh (an executable file, links resolved inside it)"),
    ],
)  # fmt: skip
def test_bad_settings_are_a_config_error_naming_the_variable(root, values, message):
    with pytest.raises(ConfigError) as caught:
        load({name: value.format(root=root) for name, value in values.items()})
    assert str(caught.value) == message.format(root=root)


@pytest.mark.slow
def test_a_bad_default_environment_stops_start_up_with_one_line(root, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "DATA_DIR": str(tmp_path / "data"), "ENVIRONMENTS_ROOT": str(root),
           "DEFAULT_ENVIRONMENT": "nope"}  # fmt: skip
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=PROJECT, env=env, capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (
        2,
        "term-executor: configuration error: DEFAULT_ENVIRONMENT: unknown environment: nope (available: alpha, beta)\n",
    )


@pytest.fixture
def with_environments(executor_config, root):
    return executor_config(environments_root=root)


@pytest.mark.django_db
def test_get_environments_lists_the_valid_ones_with_their_versions(api, with_environments, root):
    assert api.get("/environments").json() == [
        {"name": "alpha", "python": None, "node": None},
        {"name": "beta", "python": "3.11.2", "node": None},
    ]
    fake_environment(root, "gamma")  # read from the folder on each request: no restart needed
    assert [env["name"] for env in api.get("/environments").json()] == ["alpha", "beta", "gamma"]


@pytest.mark.django_db
def test_get_environments_needs_the_token(api, with_environments, executor_config):
    executor_config(auth_tokens=("tok",))
    assert api.get("/environments").status_code == 401
    assert api.get("/environments").json()["error"] == "unauthorized"
    assert api.get("/environments", HTTP_AUTHORIZATION="Bearer tok").status_code == 200


@pytest.mark.django_db
def test_without_environments_root(api):
    assert api.get("/environments").json() == []
    body = api.get("/status").json()
    assert body["environments"] == 0
    assert body["runtimes"] == envs.runtimes() and body["runtimes"]["python"]


@pytest.mark.django_db
def test_status_counts_the_valid_environments_and_shows_the_hosts_runtimes(api, with_environments, root):
    body = api.get("/status").json()
    assert body["environments"] == 2
    assert body["runtimes"] == envs.runtimes("/")  # the host's, not an environment's
    (root / "escape").symlink_to(root.parent)  # outside ENVIRONMENTS_ROOT: not counted
    assert api.get("/status").json()["environments"] == 2


@pytest.mark.django_db
def test_the_schema_describes_them(api):
    document = api.get("/api/schema").json()
    listed = document["paths"]["/environments"]["get"]
    assert set(listed["responses"]) == {"200", "401"} and {"bearerAuth": []} in listed["security"]
    schemas = document["components"]["schemas"]
    assert set(schemas["Environment"]["properties"]) == {"name", "python", "node"}
    assert {"environments", "runtimes"} <= set(schemas["Status"]["required"])
    assert set(schemas["Runtimes"]["properties"]) == {"python", "node"}
