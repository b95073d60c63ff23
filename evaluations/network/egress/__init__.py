"""Egress by policy (SPEC §12): the proxy a sandbox's commands reach the network through.

No Django and nothing of the pipeline here; the runtime may import it.

- ``policy``: EGRESS_ALLOW / EGRESS_DENY and the decision for one (host, port).
- ``proxy``: ``EgressProxy``, HTTP CONNECT and plain HTTP on a Unix socket.
- ``relay``: the argv prefix and environment that reach it from inside the sandbox.
"""

from evaluations.network.egress.policy import Decision, EgressPolicy, Rule, egress_policy, parse_rules
from evaluations.network.egress.proxy import EgressProxy, EgressRecord
from evaluations.network.egress.relay import RELAY_PORT, SANDBOX_SOCKET, proxy_env, relay_wrapper

__all__ = [
    "RELAY_PORT",
    "SANDBOX_SOCKET",
    "Decision",
    "EgressPolicy",
    "EgressProxy",
    "EgressRecord",
    "Rule",
    "egress_policy",
    "parse_rules",
    "proxy_env",
    "relay_wrapper",
]
