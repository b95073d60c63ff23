from pathlib import Path

import pytest

from executor_project.config import Config, ConfigError, load
from executor_project.dburl import parse_database_url


def test_defaults_match_the_spec():
    config = load({})
    assert config == Config()
    assert (config.port, config.session_ttl_secs, config.max_concurrent_evals, config.max_queued_evals) == (
        8080,
        1800,
        4,
        0,
    )
    assert (config.disk_quota_mb, config.memory_limit_mb, config.max_processes) == (2048, 4096, 512)
    assert (
        config.clone_timeout_secs,
        config.install_timeout_secs,
        config.agent_timeout_secs,
        config.test_timeout_secs,
    ) == (120, 600, 600, 300)
    assert (config.max_agent_code_bytes, config.max_output_bytes) == (5242880, 1048576)
    assert (config.max_task_archive_bytes, config.max_extracted_bytes, config.max_archive_members) == (
        104857600,
        524288000,
        10000,
    )
    assert config.workspace_base == Path("/tmp/sessions")
    assert (config.sandbox, config.agent_network, config.test_network) == ("auto", True, False)
    assert (config.allow_file_urls, config.allow_private_urls, config.allowed_private_hosts) == (False, False, ())
    assert (config.reap_interval_secs, config.retention_days, config.shutdown_grace_secs, config.worker_stale_secs) == (
        60,
        0,
        30,
        30,
    )
    assert (config.callback_secret, config.keep_workspaces, config.auth_tokens) == ("", False, ())


def test_values_are_parsed():
    config = load({"AUTH_TOKEN": " a, b ,,", "AGENT_NETWORK": "off", "ALLOWED_PRIVATE_HOSTS": "Git.Local,10.0.0.5",
                   "MAX_QUEUED_EVALS": "3", "KEEP_WORKSPACES": "yes", "SANDBOX": "NONE"})  # fmt: skip
    assert config.auth_tokens == ("a", "b")
    assert config.agent_network is False and config.keep_workspaces is True
    assert config.allowed_private_hosts == ("git.local", "10.0.0.5")
    assert config.admission_limit == 7 and config.sandbox == "none"


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"MAX_CONCURRENT_EVALS": "abc"}, "MAX_CONCURRENT_EVALS"),
        ({"MAX_CONCURRENT_EVALS": "0"}, "MAX_CONCURRENT_EVALS"),
        ({"MAX_QUEUED_EVALS": "-1"}, "MAX_QUEUED_EVALS"),
        ({"TEST_NETWORK": "2"}, "TEST_NETWORK"),
        ({"SANDBOX": "docker"}, "SANDBOX"),
        ({"WORKSPACE_BASE": " "}, "WORKSPACE_BASE"),
        ({"STATIC_ASSETS_CONFIG": "/nope.yaml"}, "STATIC_ASSETS_CONFIG"),
    ],  # fmt: skip
)
def test_bad_values_name_the_variable(env, needle):
    with pytest.raises(ConfigError, match=needle):
        load(env)


def test_database_urls(tmp_path):
    assert parse_database_url("", tmp_path / "x.db")["ENGINE"].endswith("sqlite3")
    sqlite = parse_database_url("sqlite:////var/lib/te.db", tmp_path / "x.db")
    assert sqlite["NAME"] == "/var/lib/te.db" and sqlite["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    pg = parse_database_url("postgres://u:p%40ss@db.example:6543/evals?sslmode=require", tmp_path / "x.db")
    assert (pg["USER"], pg["PASSWORD"], pg["HOST"], pg["PORT"], pg["NAME"]) == (
        "u",
        "p@ss",
        "db.example",
        "6543",
        "evals",
    )
    assert pg["OPTIONS"] == {"sslmode": "require"}
    with pytest.raises(ConfigError, match="DATABASE_URL"):
        parse_database_url("mysql://x/y", tmp_path / "x.db")
