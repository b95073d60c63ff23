"""EGRESS_ALLOW / EGRESS_DENY parsing and the decision for one destination (no connection is made)."""

from __future__ import annotations

import ipaddress
import socket

import psutil
import pytest

from evaluations.network.egress.policy import (
    ALLOWED,
    ALLOWED_BY_RULE,
    BAD_HOST,
    DENIED_BY_RULE,
    NOT_ALLOWED,
    NOT_IN_TASK_LIST,
    OWN_ADDRESS,
    RESOLUTION_FAILED,
    Decision,
    EgressPolicy,
    parse_rules,
)
from evaluations.network.rules import HostAddresses

PUBLIC = "93.184.215.14"  # a global unicast address; decide() never connects


def fixed_resolver(answers: dict[str, list[str]]):
    """A resolver with fixed answers, standing for a DNS server an attacker controls."""
    asked: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return answers[host]

    resolve.asked = asked
    return resolve


def decision(allowed: bool, reason: str, *addresses: str) -> Decision:
    return Decision(allowed, reason, tuple(addresses))


def policy(
    allow: str = "", deny: str = "", answers: dict[str, list[str]] | None = None, own=(), default: str = "public"
) -> EgressPolicy:
    own_ips = frozenset(ipaddress.ip_address(a) for a in own)
    return EgressPolicy.from_strings(
        allow, deny, default=default, resolver=fixed_resolver(answers or {}), own_addresses=lambda: own_ips
    )


# -- parsing ----------------------------------------------------------------


def test_every_entry_form_parses():
    rules = parse_rules(
        " pypi.org, *.npmjs.org:443 ,10.0.0.0/8,203.0.113.80:443,[::1]:8080,2001:db8::/32,[2001:db8::/48]:22,"
        "Bücher.example,"
    )
    shapes = [(r.name, r.suffix, str(r.network) if r.network else None, r.port) for r in rules]
    assert shapes == [
        ("pypi.org", None, None, None),
        (None, ".npmjs.org", None, 443),
        (None, None, "10.0.0.0/8", None),
        (None, None, "203.0.113.80/32", 443),
        (None, None, "::1/128", 8080),
        (None, None, "2001:db8::/32", None),
        (None, None, "2001:db8::/48", 22),
        ("xn--bcher-kva.example", None, None, None),
    ]
    assert parse_rules("") == () and parse_rules(" , ") == ()


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("pypi.org:0", "port '0' is not a number from 1 to 65535"),
        ("pypi.org:70000", "port '70000'"),
        ("pypi.org:https", "port 'https'"),
        ("10.0.0.1/8", "has host bits set; did you mean 10.0.0.0/8?"),
        ("300.1.1.1", "is not a valid IP address or network"),
        ("10.0.0.0/33", "is not a valid IP address or network"),
        ("*", "is not an entry: to refuse everything EGRESS_ALLOW does not name, set EGRESS_DEFAULT=deny"),
        ("foo.*.com", "a wildcard is only allowed"),
        ("*.", "is neither an IP address, a CIDR network nor a host name"),
        ("bad_host!", "is neither"),
        ("-lead.example", "is neither"),
        ("[::1", "has '[' without its ']'"),
        ("[::1]443", "expected ':port' after ']'"),
        ("[pypi.org]:443", "is not a valid IP address or network"),
        ("::1:99999:1", "is not a valid IP address or network"),
        ("fe80::1%eth0", "has an IPv6 zone ('%...'); give the address without it"),
        ("[fe80::1%eth0]:443", "has an IPv6 zone"),
        ("a" * 64 + ".example", "is neither"),
    ],
)
def test_a_bad_entry_is_refused_with_a_sentence_naming_it(entry, says):
    with pytest.raises(ValueError) as caught:
        parse_rules(f"pypi.org,{entry}", "EGRESS_DENY")
    assert str(caught.value).startswith(f"EGRESS_DENY entry {entry.strip()!r}: ")
    assert says in str(caught.value)


# -- the default rules --------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("127.0.0.1", "loopback address"),
        ("127.8.9.10", "loopback address"),
        ("::1", "loopback address"),
        ("[::1]", "loopback address"),
        ("::ffff:127.0.0.1", "loopback address"),
        ("10.1.2.3", "private address"),
        ("172.16.0.1", "private address"),
        ("172.31.255.254", "private address"),
        ("192.168.1.1", "private address"),
        ("::ffff:192.168.1.1", "private address"),
        ("fd00::1", "private address"),
        ("169.254.169.254", "link-local address"),
        ("fe80::1", "link-local address"),
        ("0.0.0.0", "unspecified address"),
        ("::", "unspecified address"),
        ("224.0.0.1", "multicast address"),
        ("ff02::1", "multicast address"),
        ("240.0.0.1", "reserved address"),
        ("100.64.0.1", "non-public address"),
        ("203.0.113.80", "private address"),  # TEST-NET-3: this machine's package registries
        ("64:ff9b::a00:1", "private address"),  # NAT64 of 10.0.0.1
    ],
)
def test_non_public_addresses_are_refused_by_default(host, reason):
    assert policy().decide(host, 443) == decision(False, reason)


def test_a_public_address_is_allowed_and_is_the_address_to_connect_to():
    assert policy().decide(PUBLIC, 443) == decision(True, ALLOWED, PUBLIC)


def test_the_hosts_own_non_loopback_address_is_refused():
    own = [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]
    if not own:
        pytest.skip("this machine has no non-loopback IPv4 address")
    real = EgressPolicy()  # the real interface addresses, read by psutil
    for address in own:
        assert real.decide(address, 8000) == decision(False, OWN_ADDRESS)


def test_a_public_address_of_the_host_itself_is_refused():
    assert policy(own=[PUBLIC]).decide(PUBLIC, 80) == decision(False, OWN_ADDRESS)
    assert policy(own=[PUBLIC]).decide(f"::ffff:{PUBLIC}", 80) == decision(False, OWN_ADDRESS)


def test_host_addresses_include_loopback_and_are_cached():
    addresses = HostAddresses(ttl=3600)
    first = addresses.get()
    assert ipaddress.ip_address("127.0.0.1") in first
    assert addresses.get() is first


# -- names ----------------------------------------------------------------------


def test_a_name_is_resolved_once_and_every_address_must_pass():
    answers = {"mixed.example": [PUBLIC, "10.0.0.5"], "good.example": [PUBLIC, "2606:4700::1"]}
    p = policy(answers=answers)
    assert p.decide("mixed.example", 443) == decision(False, "private address")
    assert p.decide("GOOD.Example.", 443) == decision(True, ALLOWED, PUBLIC, "2606:4700::1")
    assert p.resolver.asked == ["mixed.example", "good.example"]


def test_a_name_that_does_not_resolve_is_refused():
    assert policy().decide("nowhere.example", 443) == decision(False, RESOLUTION_FAILED)
    assert policy(answers={"empty.example": []}).decide("empty.example", 443) == decision(False, RESOLUTION_FAILED)


def test_the_real_resolver_is_used_by_default():
    assert EgressPolicy().decide("localhost", 80).reason == "loopback address"


@pytest.mark.parametrize("host", ["", "bad host", "a..b", "x" * 300, "exa_mple.com:80", "[::1", "-x.example"])
def test_something_that_is_no_host_is_refused_without_a_lookup(host):
    p = policy()
    assert p.decide(host, 443) == decision(False, BAD_HOST)
    assert p.resolver.asked == []


@pytest.mark.parametrize("port", [0, -1, 65536])
def test_a_bad_port_is_refused(port):
    assert policy().decide(PUBLIC, port).allowed is False


# -- EGRESS_ALLOW ---------------------------------------------------------------------


def test_allow_by_host_name_admits_its_private_addresses():
    p = policy("pypi.org", answers={"pypi.org": ["203.0.113.80"], "evil.org": ["203.0.113.80"]})
    assert p.decide("pypi.org", 443) == decision(True, ALLOWED_BY_RULE, "203.0.113.80")
    assert p.decide("evil.org", 443) == decision(False, "private address")


def test_allow_by_wildcard_admits_subdomains_only():
    answers = {n: ["10.9.9.9"] for n in ("a.corp.example", "a.b.corp.example", "corp.example", "xcorp.example")}
    p = policy("*.corp.example", answers=answers)
    assert p.decide("a.corp.example", 80).allowed
    assert p.decide("a.b.corp.example", 80).allowed
    assert not p.decide("corp.example", 80).allowed
    assert not p.decide("xcorp.example", 80).allowed


def test_allow_by_cidr_admits_names_whose_addresses_are_all_inside():
    answers = {"db.internal": ["10.1.2.3"], "split.internal": ["10.1.2.3", "192.168.0.1"]}
    p = policy("10.0.0.0/8", answers=answers)
    assert p.decide("10.200.0.1", 5432) == decision(True, ALLOWED_BY_RULE, "10.200.0.1")
    assert p.decide("::ffff:10.200.0.1", 5432).allowed  # IPv4-mapped: the same address
    assert p.decide("db.internal", 5432) == decision(True, ALLOWED_BY_RULE, "10.1.2.3")
    assert p.decide("split.internal", 5432) == decision(False, "private address")
    assert p.decide("11.0.0.1", 5432) == decision(True, ALLOWED, "11.0.0.1")  # public anyway


def test_allow_by_port_admits_that_port_only():
    p = policy("127.0.0.1:8080,[::1]:8443,localhost:9000", answers={"localhost": ["127.0.0.1", "::1"]})
    assert p.decide("127.0.0.1", 8080).allowed
    assert p.decide("127.0.0.1", 8081) == decision(False, "loopback address")
    assert p.decide("::1", 8443).allowed
    assert not p.decide("::1", 8080).allowed
    assert p.decide("localhost", 9000) == decision(True, ALLOWED_BY_RULE, "127.0.0.1", "::1")
    assert not p.decide("localhost", 9001).allowed


def test_allow_overrides_the_hosts_own_address():
    p = policy(f"{PUBLIC}:443", own=[PUBLIC])
    assert p.decide(PUBLIC, 443).allowed
    assert p.decide(PUBLIC, 80) == decision(False, OWN_ADDRESS)


# -- EGRESS_DENY ------------------------------------------------------------------------


def test_deny_beats_allow_by_name_and_by_address():
    answers = {"pypi.org": ["203.0.113.80"], "files.pythonhosted.org": ["203.0.113.80"]}
    p = policy("pypi.org,files.pythonhosted.org", "files.pythonhosted.org", answers)
    assert p.decide("pypi.org", 443).allowed
    assert p.decide("files.pythonhosted.org", 443) == decision(False, DENIED_BY_RULE)
    by_address = policy("pypi.org", "203.0.113.0/24:443", answers)
    assert by_address.decide("pypi.org", 443) == decision(False, DENIED_BY_RULE)
    assert by_address.decide("pypi.org", 80).allowed


def test_deny_refuses_public_destinations_and_mapped_addresses():
    p = policy(deny=f"*.example.com,{PUBLIC}", answers={"api.example.com": ["1.1.1.1"], "ok.example": ["1.1.1.1"]})
    assert p.decide("api.example.com", 443) == decision(False, DENIED_BY_RULE)
    assert p.decide(PUBLIC, 443) == decision(False, DENIED_BY_RULE)
    assert p.decide(f"::ffff:{PUBLIC}", 443) == decision(False, DENIED_BY_RULE)
    assert p.decide("ok.example", 443).allowed


def test_a_denied_name_is_refused_before_any_lookup():
    p = policy(deny="secret.example")
    assert p.decide("secret.example", 443) == decision(False, DENIED_BY_RULE)
    assert p.resolver.asked == []


# -- EGRESS_DEFAULT=deny: a closed list -------------------------------------------------


def test_a_closed_list_admits_only_what_allow_names():
    answers = {"api.example.com": [PUBLIC], "other.example": [PUBLIC], "pypi.org": ["203.0.113.80"]}
    p = policy("api.example.com:443,pypi.org", answers=answers, default="deny")
    assert p.decide("api.example.com", 443) == decision(True, ALLOWED_BY_RULE, PUBLIC)
    assert p.decide("pypi.org", 443) == decision(True, ALLOWED_BY_RULE, "203.0.113.80")
    # Public destinations the default rules let through are refused now, by name, address or port.
    assert policy(answers=answers).decide("other.example", 443).allowed
    assert p.decide("other.example", 443) == decision(False, NOT_ALLOWED)
    assert p.decide(PUBLIC, 443) == decision(False, NOT_ALLOWED)
    assert p.decide("api.example.com", 80) == decision(False, NOT_ALLOWED)
    assert p.decide("127.0.0.1", 443) == decision(False, NOT_ALLOWED)


def test_a_closed_list_by_cidr_needs_every_address_inside():
    answers = {"db.internal": ["10.1.2.3"], "split.internal": ["10.1.2.3", PUBLIC]}
    p = policy("10.0.0.0/8", answers=answers, default="deny")
    assert p.decide("db.internal", 5432).allowed
    assert p.decide("split.internal", 5432) == decision(False, NOT_ALLOWED)  # its public address is not listed


def test_deny_still_beats_allow_in_a_closed_list():
    p = policy("api.example.com", "api.example.com:80", {"api.example.com": [PUBLIC]}, default="deny")
    assert p.decide("api.example.com", 443).allowed
    assert p.decide("api.example.com", 80) == decision(False, DENIED_BY_RULE)


def test_an_address_the_executor_allows_for_one_step_is_reached_in_a_closed_list():
    p = policy(answers={"git.example": ["10.0.0.7"]}, default="deny")
    assert p.decide("git.example", 443) == decision(False, NOT_ALLOWED)
    cloning = p.allowing(["10.0.0.7"], 443, "the task's repository")
    assert cloning.default == "deny"
    assert cloning.decide("git.example", 443) == decision(True, ALLOWED_BY_RULE, "10.0.0.7")
    assert cloning.decide("git.example", 22) == decision(False, NOT_ALLOWED)
    assert cloning.decide(PUBLIC, 443) == decision(False, NOT_ALLOWED)


def test_an_unknown_default_is_refused():
    with pytest.raises(ValueError, match="EGRESS_DEFAULT"):
        policy(default="closed")


# -- a task's allowlist on top (SPEC §17 network_mode allowlist) -----------------------------------


def narrowed(hosts: str, *, allow: str = "", default: str = "public"):
    resolver = fixed_resolver({"pypi.org": [PUBLIC], "evil.example": [PUBLIC], "files.pythonhosted.org": [PUBLIC],
                               "internal.corp": ["10.0.0.7"]})  # fmt: skip
    policy = EgressPolicy.from_strings(allow, "", default=default, resolver=resolver, own_addresses=lambda: ())
    return policy.only(parse_rules(hosts, "allowed_hosts"))


def test_a_task_allowlist_refuses_what_it_does_not_name_even_when_public():
    policy = narrowed("pypi.org,*.pythonhosted.org")
    assert policy.decide("pypi.org", 443) == Decision(True, ALLOWED, (PUBLIC,))
    assert policy.decide("files.pythonhosted.org", 443).allowed
    assert policy.decide("evil.example", 443) == Decision(False, NOT_IN_TASK_LIST)
    assert policy.decide(PUBLIC, 443) == Decision(False, NOT_IN_TASK_LIST)  # an address it does not list


def test_the_operators_rules_still_decide_what_a_task_allowlist_names():
    private = narrowed("internal.corp")  # named by the task, refused by the operator's default rules
    assert private.decide("internal.corp", 443) == Decision(False, "private address")
    denied = EgressPolicy.from_strings("", "pypi.org", resolver=fixed_resolver({"pypi.org": [PUBLIC]}),
                                       own_addresses=lambda: ()).only(parse_rules("pypi.org"))  # fmt: skip
    assert denied.decide("pypi.org", 443) == Decision(False, DENIED_BY_RULE)
    closed = narrowed("pypi.org", default="deny")  # EGRESS_DEFAULT=deny: still a closed list
    assert closed.decide("pypi.org", 443) == Decision(False, NOT_ALLOWED)


def test_an_address_the_executor_allows_for_one_step_passes_the_task_allowlist_too():
    policy = narrowed("pypi.org").allowing(["10.0.0.9"], 8000, "the task's repository")
    assert policy.decide("10.0.0.9", 8000).allowed
    assert policy.decide("evil.example", 443) == Decision(False, NOT_IN_TASK_LIST)


def test_one_phases_list_replaces_anothers_and_widening_leaves_the_operators_rules():
    """A phase switch (pipeline/verifier.phase_egress): the agent's list, then the verifier's on the same
    policy, never both; ``widened`` drops the list and keeps EGRESS_ALLOW, EGRESS_DENY and the defaults."""
    agent = narrowed("pypi.org")
    verifier = agent.only(parse_rules("*.pythonhosted.org", "allowed_hosts"))
    assert verifier.decide("pypi.org", 443) == Decision(False, NOT_IN_TASK_LIST)
    assert verifier.decide("files.pythonhosted.org", 443).allowed
    public = verifier.widened()
    assert public.decide("pypi.org", 443).allowed and public.decide("evil.example", 443).allowed
    assert public.decide("internal.corp", 443) == Decision(False, "private address")
    assert agent.decide("pypi.org", 443).allowed  # the agent's policy object is left as it was
