"""EGRESS_ALLOW / EGRESS_DENY / EGRESS_DEFAULT, and the decision for one destination (host, port).

An entry is ``host``, ``*.domain`` (its subdomains, not the domain itself),
an IP address or a CIDR network, each with an optional ``:port``; an IPv6
address or network takes brackets when it has a port (``[::1]:443``,
``[2001:db8::/32]:443``). Entries are separated by commas.

The decision (``EgressPolicy.decide``):

1. The host is resolved once, here (an IP literal is not resolved). Those
   addresses are the only ones the proxy may connect to, so a name that
   answers differently a moment later (DNS rebinding) changes nothing.
2. Anything matching EGRESS_DENY, by name or by any of its addresses, is
   refused, even if EGRESS_ALLOW lists it too.
3. A destination matching EGRESS_ALLOW (its name, or each of its addresses)
   is allowed whatever its addresses are.
4. Otherwise, with EGRESS_DEFAULT=deny (a closed list), the destination is
   refused: only what EGRESS_ALLOW names (and what the executor allows for
   one step, ``allowing``) is reached.
5. Otherwise (EGRESS_DEFAULT=public) every address must be public
   (``netrules.forbidden_reason``, IPv4 inside IPv6 unwrapped) and not one of
   this machine's own: one bad address refuses the name, as in the URL guard.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from evaluations.network.rules import HostAddresses, IPAddress, forbidden_reason, parse_address, unwrap

# Reasons: short, stable strings, stored with every egress record.
ALLOWED = "allowed"
ALLOWED_BY_RULE = "allowed by EGRESS_ALLOW"
DENIED_BY_RULE = "denied by EGRESS_DENY"
NOT_ALLOWED = "not in EGRESS_ALLOW"  # EGRESS_DEFAULT=deny
NOT_IN_TASK_LIST = "not in the task's allowed_hosts"  # SPEC §17 network_mode allowlist
RESOLUTION_FAILED = "resolution failed"
OWN_ADDRESS = "host's own address"
BAD_HOST = "bad host"
# The others come from netrules without their article: "loopback address", "private address",
# "link-local address", "multicast address", "reserved address", "unspecified address",
# "non-public address".

# EGRESS_DEFAULT: what a destination EGRESS_ALLOW does not name gets.
PUBLIC = "public"  # reached when every address is public (SPEC §12)
DENY = "deny"  # refused: a closed list
DEFAULTS = (PUBLIC, DENY)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")


@dataclass(frozen=True)
class Rule:
    """One entry of EGRESS_ALLOW or EGRESS_DENY."""

    text: str
    name: str | None = None  # an exact host name, lower case
    suffix: str | None = None  # "*.example.com" -> ".example.com"
    network: Network | None = None
    port: int | None = None  # None: every port

    def matches_name(self, host: str, port: int) -> bool:
        if self.port is not None and port != self.port:
            return False
        if self.name is not None:
            return host == self.name
        return self.suffix is not None and host.endswith(self.suffix)

    def matches_address(self, ip: IPAddress, port: int) -> bool:
        if self.network is None or (self.port is not None and port != self.port):
            return False
        return any(
            candidate in self.network for candidate in {ip, unwrap(ip)} if candidate.version == self.network.version
        )


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    addresses: tuple[str, ...] = ()  # the checked addresses, the only ones to connect to


def parse_rules(value: str, variable: str = "EGRESS_ALLOW") -> tuple[Rule, ...]:
    """Parse a comma-separated list; raise ValueError with one sentence naming the bad entry."""
    rules = []
    for entry in (value or "").split(","):
        entry = entry.strip()
        if entry:
            try:
                rules.append(parse_rule(entry))
            except ValueError as exc:
                raise ValueError(f"{variable} entry {entry!r}: {exc}") from None
    return tuple(rules)


def parse_rule(entry: str) -> Rule:
    """One entry: ``host``, ``*.domain``, IP or CIDR, each with an optional ``:port``."""
    if entry.startswith("["):
        inside, bracket, rest = entry[1:].partition("]")
        if not bracket:
            raise ValueError("has '[' without its ']'")
        if rest and not rest.startswith(":"):
            raise ValueError("expected ':port' after ']'")
        return Rule(entry, network=_network(inside), port=_port(rest[1:]) if rest else None)
    if entry.count(":") >= 2:  # a bare IPv6 address or network: no port possible without brackets
        return Rule(entry, network=_network(entry))
    host, colon, port_text = entry.partition(":")
    port = _port(port_text) if colon else None
    if _looks_like_address(host):
        return Rule(entry, network=_network(host), port=port)
    if host.startswith("*."):
        return Rule(entry, suffix="." + _host_name(host[2:]), port=port)
    if host == "*":
        raise ValueError("is not an entry: to refuse everything EGRESS_ALLOW does not name, set EGRESS_DEFAULT=deny")
    if "*" in host:
        raise ValueError("a wildcard is only allowed as a leading '*.' (as in *.example.com)")
    return Rule(entry, name=_host_name(host), port=port)


def _looks_like_address(host: str) -> bool:
    return bool(host) and ("/" in host or host.replace(".", "").isdigit())


def _network(text: str) -> Network:
    if "%" in text:  # ipaddress keeps a zone (fe80::1%eth0) in the network; no destination has one
        raise ValueError("has an IPv6 zone ('%...'); give the address without it")
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        try:
            loose = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise ValueError(f"is not a valid IP address or network ({exc})") from None
        raise ValueError(f"has host bits set; did you mean {loose}?") from None


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"port {text!r} is not a number from 1 to 65535")
    return int(text)


def _host_name(text: str) -> str:
    """A DNS name, lower case, without its trailing dot; non-ASCII names in their IDNA form."""
    name = text.rstrip(".").lower()
    if not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError("is not a valid host name") from None
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels) or labels[-1].isdigit():
        raise ValueError("is neither an IP address, a CIDR network nor a host name")
    return name


def normalise_host(host: str) -> str:
    """A request's host as the rules compare it; raise ValueError for something that is no host."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(parse_address(text)) if _is_address(text) else _host_name(text)
    except ValueError:
        raise ValueError(f"{host[:100]!r} is not a host name or IP address") from None


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text.split("%", 1)[0])
        return True
    except ValueError:
        return False


Resolver = Callable[[str, int], Iterable[str]]


def system_resolver(host: str, port: int) -> list[str]:
    """Every address of ``host`` from the system's resolver, in its order, duplicates dropped."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class EgressPolicy:
    """The allow and deny lists plus the default rules; ``decide`` is safe from many threads."""

    def __init__(
        self,
        allow: Iterable[Rule] = (),
        deny: Iterable[Rule] = (),
        *,
        default: str = PUBLIC,
        resolver: Resolver = system_resolver,
        own_addresses: Callable[[], Iterable[IPAddress]] | None = None,
    ):
        if default not in DEFAULTS:
            raise ValueError(f"EGRESS_DEFAULT: expected one of {', '.join(DEFAULTS)}, got {default!r}")
        self.allow = tuple(allow)
        self.deny = tuple(deny)
        self.default = default
        self.resolver = resolver
        self.own_addresses = own_addresses or HostAddresses().get
        self.narrowing: tuple[Rule, ...] | None = None  # only (SPEC §17): a task's own list, on top
        self.narrowing_label = ""

    def _narrowed_in(self, host: str, port: int) -> bool:
        """Whether the task's list names ``host`` (by name; an address entry by the literal address)."""
        if any(rule.matches_name(host, port) for rule in self.narrowing):
            return True
        if _is_address(host):
            ip = parse_address(host)
            return any(rule.matches_address(ip, port) for rule in self.narrowing)
        return False

    @classmethod
    def from_strings(cls, allow: str = "", deny: str = "", **kwargs) -> EgressPolicy:
        """From the variables' values; ValueError names the variable and the entry."""
        return cls(parse_rules(allow, "EGRESS_ALLOW"), parse_rules(deny, "EGRESS_DENY"), **kwargs)

    def allowing(self, addresses: Iterable[str], port: int, label: str = "checked address") -> EgressPolicy:
        """This policy, plus ``addresses`` at ``port`` allowed (an address the executor checked itself)."""
        entries = ",".join(f"[{a}]:{port}" if ":" in a else f"{a}:{port}" for a in addresses)
        extra = parse_rules(entries, label) if entries else ()
        wider = EgressPolicy(
            (*self.allow, *extra),
            self.deny,
            default=self.default,
            resolver=self.resolver,
            own_addresses=self.own_addresses,
        )
        if self.narrowing is not None:
            wider.narrowing = (*self.narrowing, *extra)
            wider.narrowing_label = self.narrowing_label
        return wider

    def only(self, rules: Iterable[Rule], label: str = "the task's allowed_hosts") -> EgressPolicy:
        """This policy narrowed to ``rules`` (a task's allowlist, SPEC §17): a destination they do not
        name is refused; one they name is then decided by this policy as before (the smaller wins).
        A narrowed policy's own narrowing is replaced, not combined (one phase's list, then another's)."""
        narrowed = self.widened()
        narrowed.narrowing = tuple(rules)
        narrowed.narrowing_label = label
        return narrowed

    def widened(self) -> EgressPolicy:
        """This policy without a narrowing (``only``): the operator's rules alone."""
        return EgressPolicy(
            self.allow, self.deny, default=self.default, resolver=self.resolver, own_addresses=self.own_addresses
        )

    def decide(self, host: str, port: int) -> Decision:
        """Whether a connection to ``host:port`` may be made, and to which addresses."""
        try:
            host = normalise_host(host)
        except ValueError:
            return Decision(False, BAD_HOST)
        if not 1 <= port <= 65535:
            return Decision(False, BAD_HOST)
        if any(rule.matches_name(host, port) for rule in self.deny):
            return Decision(False, DENIED_BY_RULE)
        if self.narrowing is not None and not self._narrowed_in(host, port):
            return Decision(False, NOT_IN_TASK_LIST)
        if _is_address(host):
            addresses = [host]
        else:
            try:
                addresses = list(self.resolver(host, port))
            except (OSError, UnicodeError):
                return Decision(False, RESOLUTION_FAILED)
            if not addresses:
                return Decision(False, RESOLUTION_FAILED)
        ips = [parse_address(a) for a in addresses]
        if any(rule.matches_address(ip, port) for ip in ips for rule in self.deny):
            return Decision(False, DENIED_BY_RULE)
        if any(rule.matches_name(host, port) for rule in self.allow):
            return Decision(True, ALLOWED_BY_RULE, tuple(addresses))
        listed = [any(rule.matches_address(ip, port) for rule in self.allow) for ip in ips]
        if all(listed):
            return Decision(True, ALLOWED_BY_RULE, tuple(addresses))
        if self.default == DENY:
            return Decision(False, NOT_ALLOWED)
        own = self.own_addresses()
        for ip, is_listed in zip(ips, listed, strict=True):
            if is_listed:
                continue
            if unwrap(ip) in own and not unwrap(ip).is_loopback:  # loopback: its own reason below
                return Decision(False, OWN_ADDRESS)
            if reason := forbidden_reason(ip):
                return Decision(False, reason.removeprefix("a ").removeprefix("an "))
        return Decision(True, ALLOWED, tuple(addresses))


def egress_policy(config) -> EgressPolicy:
    """The EgressPolicy of a Config's EGRESS_ALLOW, EGRESS_DENY and EGRESS_DEFAULT (ValueError names
    the variable and entry)."""
    return EgressPolicy.from_strings(
        ",".join(config.egress_allow), ",".join(config.egress_deny), default=config.egress_default
    )
