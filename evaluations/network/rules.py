"""Which addresses a connection made on a task's behalf must not reach by default.

Shared by the URL guard (the executor's own fetches) and the egress proxy
(the sandbox's connections), so both refuse the same addresses. No Django
here, nothing of the pipeline or the runtime.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time

import psutil

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def forbidden_reason(ip: IPAddress) -> str | None:
    """Why connecting to ``ip`` is refused by default, or None for a public address."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = [ip.ipv4_mapped, ip.sixtofour]
        if ip.teredo:
            embedded.append(ip.teredo[1])
        if ip in _NAT64:
            embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        for inner in embedded:
            if inner is not None and (reason := forbidden_reason(inner)):
                return reason
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_reserved:
        return "a reserved address"
    if ip.is_private:
        return "a private address"
    if not ip.is_global:
        return "a non-public address"
    return None


def parse_address(text: str) -> IPAddress:
    """An address as getaddrinfo or a client wrote it: brackets and an IPv6 zone (``%eth0``) dropped."""
    return ipaddress.ip_address(text.strip("[]").split("%", 1)[0])


def unwrap(ip: IPAddress) -> IPAddress:
    """The IPv4 address inside an IPv4-mapped IPv6 one (``::ffff:10.0.0.1``), else ``ip``."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class HostAddresses:
    """The addresses of this machine's own interfaces, read again at most every ``ttl`` seconds.

    A service listening on a public interface address is as much "the host" as
    one on 127.0.0.1; interfaces can gain addresses while the service runs.
    """

    def __init__(self, ttl: float = 30.0):
        self.ttl = ttl
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._addresses: frozenset[IPAddress] = frozenset()

    def get(self) -> frozenset[IPAddress]:
        with self._lock:
            if time.monotonic() - self._read_at >= self.ttl:
                self._addresses = frozenset(_interface_addresses())
                self._read_at = time.monotonic()
            return self._addresses


def _interface_addresses() -> set[IPAddress]:
    found: set[IPAddress] = set()
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    found.add(unwrap(parse_address(address.address)))
                except ValueError:
                    continue
    return found
