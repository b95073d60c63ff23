"""URL rules (SPEC section 7) against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import pytest

from evaluations.network.urlguard import (
    URLPolicy,
    URLRefused,
    check_git_url,
    check_url,
    git_allow_protocol,
    git_resolve_pin,
)

DEFAULT = {"allowed_schemes": ("http", "https"), "allow_private": False, "allowed_private_hosts": ()}


def refused(url: str, **overrides) -> str:
    with pytest.raises(URLRefused) as info:
        check_url(url, **{**DEFAULT, **overrides})
    return str(info.value)


# -- check_url: addresses -----------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1/x", "task_url host 127.0.0.1 resolves to a loopback address (127.0.0.1)"),
        ("http://127.0.0.2/x", "task_url host 127.0.0.2 resolves to a loopback address (127.0.0.2)"),
        ("http://[::1]:8080/x", "task_url host ::1 resolves to a loopback address (::1)"),
        ("http://0.0.0.0/x", "task_url host 0.0.0.0 resolves to an unspecified address (0.0.0.0)"),
        ("http://[::]/x", "task_url host :: resolves to an unspecified address (::)"),
        (
            "http://169.254.169.254/latest/meta-data/",
            "task_url host 169.254.169.254 resolves to a link-local address (169.254.169.254)",
        ),
        ("http://10.1.2.3/", "task_url host 10.1.2.3 resolves to a private address (10.1.2.3)"),
        ("http://192.168.0.1/", "task_url host 192.168.0.1 resolves to a private address (192.168.0.1)"),
        ("http://[fd00::2]/", "task_url host fd00::2 resolves to a private address (fd00::2)"),
        ("http://224.0.0.1/", "task_url host 224.0.0.1 resolves to a multicast address (224.0.0.1)"),
        ("http://240.0.0.1/", "task_url host 240.0.0.1 resolves to a reserved address (240.0.0.1)"),
        ("http://100.64.0.1/", "task_url host 100.64.0.1 resolves to a non-public address (100.64.0.1)"),
        # IPv4 inside IPv6 is unwrapped: mapped, NAT64, 6to4.
        ("http://[::ffff:127.0.0.1]/", "task_url host ::ffff:127.0.0.1 resolves to a loopback address"),
        ("http://[64:ff9b::a9fe:a9fe]/", "task_url host 64:ff9b::a9fe:a9fe resolves to a link-local address"),
        ("http://[2002:7f00:1::]/", "task_url host 2002:7f00:1:: resolves to a loopback address"),
        # Odd spellings the resolver understands are caught after resolution.
        ("http://2130706433/", "task_url host 2130706433 resolves to a loopback address (127.0.0.1)"),
        ("http://0x7f.1/", "task_url host 0x7f.1 resolves to a loopback address (127.0.0.1)"),
        ("http://localhost/", "task_url host localhost resolves to a loopback address"),
    ],
)
def test_internal_addresses_are_refused_by_default(url, message):
    assert refused(url).startswith(message)


def test_label_names_the_field():
    assert refused("http://127.0.0.1/", label="callback_url").startswith("callback_url host 127.0.0.1")


def test_public_address_is_accepted():
    resolved = check_url("https://93.184.216.34/a/b.tar.gz?sig=1", **DEFAULT)
    assert resolved.addresses == ("93.184.216.34",)
    assert (resolved.host, resolved.port, resolved.target) == ("93.184.216.34", 443, "/a/b.tar.gz?sig=1")
    assert resolved.display == "https://93.184.216.34/a/b.tar.gz"  # no query: it may hold a signature


def test_allowed_private_hosts_by_name_address_and_network():
    listed = {**DEFAULT, "allowed_private_hosts": ("LocalHost", "127.0.0.2", "10.0.0.0/8")}
    assert check_url("http://localhost:1/", **listed).host == "localhost"
    assert check_url("http://127.0.0.2/", **listed).addresses == ("127.0.0.2",)
    assert check_url("http://10.9.8.7/", **listed).addresses == ("10.9.8.7",)
    assert "loopback" in refused("http://127.0.0.3/", **{"allowed_private_hosts": ("127.0.0.2",)})


def test_allow_private_lets_everything_through():
    assert check_url("http://169.254.169.254/", **{**DEFAULT, "allow_private": True}).port == 80


# -- check_url: form ----------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ftp://example.com/x", "scheme 'ftp' is not allowed (allowed: http, https)"),
        ("file:///etc/passwd", "scheme 'file' is not allowed"),
        ("http://user:pw@93.184.216.34/x", "must not contain a user name or password"),
        ("http://user@93.184.216.34/x", "must not contain a user name or password"),
        ("http://93.184.216.34/" + "a" * 2048, "longer than 2048 characters"),
        ("http://93.184.216.34/a b", "whitespace or control characters"),
        ("http://93.184.216.34/a\r\nX-Evil: 1", "whitespace or control characters"),
        ("http:///path", "has no host"),
        ("http://93.184.216.34:99999/", "not a valid URL"),
        ("example.com/x.tar.gz", "not an absolute URL"),
        ("", "is empty"),
        ("http://no-such-host.invalid/", "cannot be resolved"),
    ],
)
def test_malformed_urls_are_refused(url, fragment):
    assert fragment in refused(url)


def test_file_urls_only_when_allowed(tmp_path):
    resolved = check_url(f"file://{tmp_path}/a%20b.tar", **{**DEFAULT, "allowed_schemes": ("http", "https", "file")})
    assert resolved.target == f"{tmp_path}/a b.tar"
    assert "must be file:///absolute/path" in refused("file://host/x", allowed_schemes=("file",))


# -- check_git_url ------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ext::sh -c x", "git transport helper 'ext::'"),
        ("fd::17", "git transport helper 'fd::'"),
        ("-oProxyCommand=touch /tmp/pwned", "must not start with '-'"),
        ("--upload-pack=touch /tmp/x", "must not start with '-'"),
        ("ssh://git@example.com/repo.git", "scheme 'ssh' is not allowed"),
        ("git://example.com/repo.git", "scheme 'git' is not allowed"),
        ("file:///srv/repo.git", "scheme 'file' is not allowed"),
        ("https://token@github.com/org/repo.git", "user name or password"),
        ("", "is empty"),
    ],
)
def test_git_urls_refused(url, fragment):
    with pytest.raises(URLRefused) as info:
        check_git_url(url, allow_file=False, resolve=False)
    assert fragment in str(info.value)
    assert str(info.value).startswith("repo ")


def test_git_urls_accepted():
    assert check_git_url("https://github.com/org/repo.git", allow_file=False, resolve=False).host == "github.com"
    assert check_git_url("file:///srv/repo.git", allow_file=True, resolve=False).target == "/srv/repo.git"


def test_git_url_address_check_when_resolving():
    with pytest.raises(URLRefused, match="repo host 127.0.0.1 resolves to a loopback address"):
        check_git_url("http://127.0.0.1:9/repo.git", allow_file=False)
    ok = check_git_url("http://127.0.0.1:9/repo.git", allow_file=False, allowed_private_hosts=("127.0.0.1",))
    assert git_resolve_pin(ok) == "127.0.0.1:9:127.0.0.1"


def test_git_allow_protocol():
    assert git_allow_protocol(False) == "http:https"
    assert git_allow_protocol(True) == "http:https:file"


def test_policy_from_config():
    from executor_project.config import Config

    policy = URLPolicy.from_config(Config(allow_file_urls=True, allowed_private_hosts=("minio",)))
    assert policy.allowed_schemes == ("http", "https", "file")
    assert policy.allowed_private_hosts == ("minio",)
    assert URLPolicy.from_config(Config()).allowed_schemes == ("http", "https")


def test_a_verifying_context_is_made_once_per_ca_file_and_anew_when_the_file_changes(tmp_path):
    """Loading a CA store is ~17 ms of CPU: every https download and pull of a process shares one
    context per file; a file rewritten (another CA) gets its own, and the system's store is one."""
    import shutil
    import ssl

    from evaluations.network.urlguard import verifying_context
    from tests.helpers.httpserver import make_tls_files

    first_ca, _, _ = make_tls_files(tmp_path / "first")
    other_ca, _, _ = make_tls_files(tmp_path / "other")
    context = verifying_context(str(first_ca))
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [cert["subject"] for cert in context.get_ca_certs()] == [((("commonName", "test CA"),),)]
    assert verifying_context(str(first_ca)) is context
    shutil.copyfile(other_ca, first_ca)  # the same path, another CA
    assert verifying_context(str(first_ca)) is not context
    assert verifying_context() is verifying_context() and verifying_context() is not context
    with pytest.raises(FileNotFoundError):
        verifying_context(str(tmp_path / "missing.pem"))
