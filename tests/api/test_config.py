import dataclasses
from pathlib import Path

import pytest

from evaluations.network.egress import egress_policy
from executor_project.config import SETTINGS, Config, ConfigError, django_secret_key
from executor_project.dburl import parse_database_url
from executor_project.settings_loader import load


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
        ({"EGRESS_DEFAULT": "closed"}, "EGRESS_DEFAULT: expected one of public, deny, got 'closed'"),
        ({"EGRESS_DEFAULT": "allow"}, "EGRESS_DEFAULT"),
        ({"EGRESS_DENY": "*"}, "EGRESS_DENY entry '\\*': .* set EGRESS_DEFAULT=deny"),
    ],  # fmt: skip
)
def test_bad_values_name_the_variable(env, needle):
    with pytest.raises(ConfigError, match=needle):
        load(env)


def test_egress_default_is_public_and_deny_can_be_set():
    assert load({}).egress_default == "public"
    assert load({"EGRESS_DEFAULT": " Deny ", "EGRESS_ALLOW": "api.example.com"}).egress_default == "deny"
    policy = egress_policy(load({"EGRESS_DEFAULT": "deny", "EGRESS_ALLOW": "api.example.com"}))
    assert (policy.default, [rule.text for rule in policy.allow]) == ("deny", ["api.example.com"])


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


def test_every_setting_is_one_field_with_its_own_variable():
    variables = [field.metadata["env"] for field in SETTINGS]
    assert len(variables) == len(set(variables))
    # Every field but the assets read from STATIC_ASSETS_CONFIG is a variable.
    assert {field.name for field in dataclasses.fields(Config)} - {field.name for field in SETTINGS} == {
        "static_assets"
    }
    for field in SETTINGS:  # a value written as its default reads back as the default
        default = field.default
        raw = ",".join(default) if isinstance(default, tuple) else "" if default is None else str(default)
        if raw:
            assert getattr(load({field.metadata["env"]: raw}), field.name) == default, field.name


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MONITOR_INTERVAL_MS": "5"}, "MONITOR_INTERVAL_MS: must be at least 10 and at most 10000, got 5"),
        ({"MAX_PROCESSES": "0"}, "MAX_PROCESSES: must be at least 1, got 0"),
        ({"PORT": " 80x"}, "PORT: expected an integer, got ' 80x'"),
        ({"KEEP_WORKSPACES": "maybe"}, "KEEP_WORKSPACES: expected on/off, true/false, yes/no or 1/0, got 'maybe'"),
        ({"LOG_LEVEL": "verbose"}, "LOG_LEVEL: expected one of debug, info, warning, error, got 'verbose'"),
        ({"LOG_FORMAT": "xml"}, "LOG_FORMAT: expected one of text, json, got 'xml'"),
        ({"DATA_DIR": ""}, "DATA_DIR: must not be empty"),
        ({"STATIC_ASSETS_ROOT": "/nonexistent-root"}, "STATIC_ASSETS_ROOT: no such folder /nonexistent-root"),
    ],
)
def test_each_kind_of_mistake_is_worded_for_the_operator(env, message):
    with pytest.raises(ConfigError) as caught:
        load(env)
    assert str(caught.value) == message


def test_empty_values_keep_the_default_and_blanks_parse_as_empty():
    config = load({"MAX_PROCESSES": "", "AGENT_NETWORK": "", "SANDBOX": "", "LOG_LEVEL": "", "DATABASE_URL": " ",
                   "STATIC_ASSETS_ROOT": "  ", "AUTH_TOKEN": " , ", "ALLOWED_PRIVATE_HOSTS": ""})  # fmt: skip
    assert config == Config()
    assert load({"LOG_LEVEL": " Debug "}).log_level == "DEBUG" and load({"SANDBOX": "BWRAP"}).sandbox == "bwrap"
    assert load({"DATA_DIR": "rel/dir"}).data_dir == Path.cwd() / "rel/dir"


def test_gunicorn_bind_and_secret_key_are_read_by_load(tmp_path):
    assert load({}).bind == "0.0.0.0:8080" and load({"PORT": "9000"}).bind == "0.0.0.0:9000"
    assert load({"GUNICORN_BIND": " 127.0.0.1:9001 ", "PORT": "9000"}).bind == "127.0.0.1:9001"
    assert django_secret_key(load({"SECRET_KEY": " given ", "DATA_DIR": str(tmp_path)})) == " given "
    assert not (tmp_path / "secret_key").exists()
    generated = django_secret_key(load({"DATA_DIR": str(tmp_path)}))
    assert len(generated) > 50 and (tmp_path / "secret_key").read_text() == generated
    assert django_secret_key(load({"DATA_DIR": str(tmp_path), "SECRET_KEY": ""})) == generated


def test_secrets_stay_out_of_the_configs_repr():
    config = load({"AUTH_TOKEN": "tok-1", "SECRET_KEY": "sk-2", "CALLBACK_SECRET": "cb-3",
                   "DATABASE_URL": "postgres://u:pw-4@h/db"})  # fmt: skip
    assert config.auth_tokens == ("tok-1",) and config.secret_key == "sk-2" and config.callback_secret == "cb-3"
    shown = repr(config)
    assert "max_processes=512" in shown
    assert not any(secret in shown for secret in ("tok-1", "sk-2", "cb-3", "pw-4"))


def test_auth_tokens_names_tenants_and_a_token_may_hold_a_colon():
    config = load({"AUTH_TOKENS": " alice:a-1 , bob.2_x-Y:b:2 ,, ", "AUTH_TOKEN": "op"})
    assert config.tenant_tokens == (("alice", "a-1"), ("bob.2_x-Y", "b:2")) and config.auth_tokens == ("op",)
    assert load({"AUTH_TOKENS": "alice:a-1"}).auth_enabled and not load({}).auth_enabled
    assert "a-1" not in repr(load({"AUTH_TOKENS": "alice:a-1"}))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AUTH_TOKENS": "alice:s3cret,s3cret-2"}, "AUTH_TOKENS: entry 2 must be name:token (a name, a colon, a token)"),
        ({"AUTH_TOKENS": "alice: "}, "AUTH_TOKENS: entry 1 must be name:token (a name, a colon, a token)"),
        ({"AUTH_TOKENS": ":s3cret"}, "AUTH_TOKENS: entry 1: a tenant name is 1 to 64 of A-Z a-z 0-9 _ . -"),
        ({"AUTH_TOKENS": "al ice:s3cret"}, "AUTH_TOKENS: entry 1: a tenant name is 1 to 64 of A-Z a-z 0-9 _ . -"),
        ({"AUTH_TOKENS": "a/b:s3cret"}, "AUTH_TOKENS: entry 1: a tenant name is 1 to 64 of A-Z a-z 0-9 _ . -"),
        ({"AUTH_TOKENS": f"{'n' * 65}:s3cret"}, "AUTH_TOKENS: entry 1: a tenant name is 1 to 64 of A-Z a-z 0-9 _ . -"),
        ({"AUTH_TOKENS": "alice:s3cret,alice:s3cret-2"},
         "AUTH_TOKENS: the tenant name 'alice' is listed twice; names must be unique"),
        ({"AUTH_TOKENS": "alice:s3cret,bob:s3cret"},
         "AUTH_TOKENS: tenant 'bob' has the same token as another tenant; tokens must be unique"),
        ({"AUTH_TOKENS": "alice:s3cret", "AUTH_TOKEN": "op,s3cret"},
         "AUTH_TOKENS: tenant 'alice' has a token that is also in AUTH_TOKEN; a token is either an operator's "
         "(AUTH_TOKEN) or one tenant's (AUTH_TOKENS)"),
    ],
)  # fmt: skip
def test_a_bad_auth_tokens_stops_start_naming_the_entry_never_the_token(env, message):
    with pytest.raises(ConfigError) as caught:
        load(env)
    assert str(caught.value) == message and "s3cret" not in message


def test_max_event_streams_per_token_is_a_quarter_unless_set():
    """SPEC §21: one tenant's token holds at most this many of the host's streams."""
    assert load({}).event_streams_per_token == 50
    assert load({"MAX_EVENT_STREAMS": "8"}).event_streams_per_token == 2
    assert load({"MAX_EVENT_STREAMS": "3"}).event_streams_per_token == 1  # at least 1
    assert load({"MAX_EVENT_STREAMS": "8", "MAX_EVENT_STREAMS_PER_TOKEN": "8"}).event_streams_per_token == 8
    with pytest.raises(ConfigError) as caught:
        load({"MAX_EVENT_STREAMS": "8", "MAX_EVENT_STREAMS_PER_TOKEN": "9"})
    assert str(caught.value) == "MAX_EVENT_STREAMS_PER_TOKEN: must be at most MAX_EVENT_STREAMS (8), got 9"
    with pytest.raises(ConfigError, match="MAX_EVENT_STREAMS_PER_TOKEN: must be at least 1"):
        load({"MAX_EVENT_STREAMS_PER_TOKEN": "0"})
