"""The POST /sandboxes body (SPEC §24), checked: one sentence per mistake, naming the field.

What a caller asks for is capped by what the operator allows, as a task's limits are (SPEC §17):
``memory_mb`` by MEMORY_LIMIT_MB, ``storage_mb`` by DISK_QUOTA_MB; ``cpus`` is recorded, not a
quota (the host's cores are shared, as for evaluations). The network policy is the egress proxy's
(SPEC §12) narrowed by the sandbox's: ``public`` is the operator's rules as they are, ``no-network``
refuses every connection, ``allowlist`` lets through only ``allowed_hosts`` (host names, ``*.``
wildcards, IPv4 and IPv6 addresses, CIDRs, each with an optional ``:port``), and of those only what
the operator's rules allow.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from evaluations.network.egress.policy import EgressPolicy, parse_rules
from evaluations.tasks.compose import COMPOSE_NAMES

PUBLIC, NO_NETWORK, ALLOWLIST = "public", "no-network", "allowlist"
NETWORK_MODES = (PUBLIC, NO_NETWORK, ALLOWLIST)
DEFAULT_IDLE_SECS = 600
DEFAULT_LIFETIME_SECS = 86400
MAX_ENV = 1000
_ENVIRONMENT_KINDS = ("image", "dockerfile", "task_url")
_FIELDS = {
    "environment",
    "cpus",
    "memory_mb",
    "storage_mb",
    "network",
    "env",
    "workdir",
    "user",
    "idle_timeout_secs",
    "max_lifetime_secs",
    "build_args",
}


class SpecError(ValueError):
    """A body that cannot make a sandbox; ``field`` names where."""

    def __init__(self, field_name: str, sentence: str):
        super().__init__(f"{field_name}: {sentence}")
        self.field = field_name
        self.sentence = sentence


@dataclass(frozen=True)
class Network:
    mode: str = PUBLIC
    allowed_hosts: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {"mode": self.mode, "allowed_hosts": list(self.allowed_hosts)}

    def applied_to(self, policy: EgressPolicy) -> EgressPolicy:
        """The operator's policy narrowed by this one."""
        if self.mode == PUBLIC:
            return policy
        if self.mode == NO_NETWORK:
            return policy.only((), "the sandbox's network (no-network)")
        return policy.only(parse_rules(",".join(self.allowed_hosts), "allowed_hosts"), "the sandbox's allowed_hosts")


@dataclass(frozen=True)
class SandboxSpec:
    kind: str  # image, dockerfile or task_url
    ref: str  # the image reference, the Dockerfile's path in the context, or the task's URL
    build_args: dict[str, str] = field(default_factory=dict)
    # The context's docker-compose file (COMPOSE_NAMES, at its top: the context is a Harbor task's
    # environment/): its services besides main start beside the sandbox (SPEC §23-24, host.py).
    compose: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    network: Network = Network()
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None
    idle_timeout_secs: int = DEFAULT_IDLE_SECS
    max_lifetime_secs: int = DEFAULT_LIFETIME_SECS

    def as_dict(self) -> dict:
        """What the row keeps (``spec``), from which the sandbox's process reads it back."""
        return {
            "environment": {
                self.kind: self.ref,
                **({"build_args": self.build_args} if self.build_args else {}),
                **({"compose": self.compose} if self.compose else {}),
            },
            "cpus": self.cpus,
            "memory_mb": self.memory_mb,
            "storage_mb": self.storage_mb,
            "network": self.network.as_dict(),
            "env": self.env,
            "workdir": self.workdir,
            "user": self.user,
            "idle_timeout_secs": self.idle_timeout_secs,
            "max_lifetime_secs": self.max_lifetime_secs,
        }


def parse(body, *, has_context: bool = False) -> SandboxSpec:
    """``body`` (the decoded JSON) as a SandboxSpec; SpecError names the first bad field.
    ``has_context``: a build context came with it (multipart), which a ``dockerfile`` needs."""
    if not isinstance(body, dict):
        raise SpecError("body", "expected a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise SpecError(unknown[0], f"unknown field (expected some of {', '.join(sorted(_FIELDS))})")
    kind, ref, build_args, compose = _environment(body.get("environment"), has_context)
    return SandboxSpec(
        kind=kind,
        ref=ref,
        build_args=build_args,
        compose=compose,
        cpus=_number(body, "cpus", minimum=0.01, maximum=1024),
        memory_mb=_integer(body, "memory_mb", minimum=16),
        storage_mb=_integer(body, "storage_mb", minimum=1),
        network=parse_network(body.get("network")),
        env=_env(body.get("env")),
        workdir=_workdir(body.get("workdir")),
        user=_user(body.get("user")),
        idle_timeout_secs=_integer(body, "idle_timeout_secs", minimum=1) or DEFAULT_IDLE_SECS,
        max_lifetime_secs=_integer(body, "max_lifetime_secs", minimum=1) or DEFAULT_LIFETIME_SECS,
    )


def parse_network(value, where: str = "network") -> Network:
    if value is None:
        return Network()
    if not isinstance(value, dict):
        raise SpecError(where, "expected an object {mode, allowed_hosts}")
    unknown = sorted(set(value) - {"mode", "allowed_hosts"})
    if unknown:
        raise SpecError(f"{where}.{unknown[0]}", "unknown field (expected mode, allowed_hosts)")
    mode = value.get("mode", PUBLIC)
    if mode not in NETWORK_MODES:
        raise SpecError(f"{where}.mode", f"expected one of {', '.join(NETWORK_MODES)}, got {mode!r}")
    hosts = value.get("allowed_hosts") or []
    if not isinstance(hosts, list) or not all(isinstance(host, str) and host.strip() for host in hosts):
        raise SpecError(f"{where}.allowed_hosts", "expected a list of host names, addresses or networks")
    if hosts and mode != ALLOWLIST:
        raise SpecError(f"{where}.allowed_hosts", f"goes with mode 'allowlist', not {mode!r}")
    if len(hosts) > 1000:
        raise SpecError(f"{where}.allowed_hosts", "at most 1000 entries")
    try:
        parse_rules(",".join(hosts), "allowed_hosts")
    except ValueError as exc:
        raise SpecError(f"{where}.allowed_hosts", str(exc).removeprefix("allowed_hosts ")) from None
    return Network(mode, tuple(host.strip() for host in hosts))


def _environment(value, has_context: bool) -> tuple[str, str, dict[str, str], str | None]:
    if not isinstance(value, dict):
        raise SpecError("environment", "expected {image: REF}, {dockerfile: PATH} or {task_url: URL}")
    kinds = [kind for kind in _ENVIRONMENT_KINDS if kind in value]
    if len(kinds) != 1:
        raise SpecError("environment", "expected exactly one of image, dockerfile, task_url")
    kind = kinds[0]
    unknown = sorted(set(value) - {kind, "build_args", "compose"})
    if unknown:
        raise SpecError(f"environment.{unknown[0]}", "unknown field")
    ref = value[kind]
    if not isinstance(ref, str) or not ref.strip() or len(ref) > 2048:
        raise SpecError(f"environment.{kind}", "expected a non-empty string")
    ref = ref.strip()
    build_args = value.get("build_args") or {}
    if kind != "dockerfile" and build_args:
        raise SpecError("environment.build_args", "goes with dockerfile only")
    if not isinstance(build_args, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in build_args.items()
    ):
        raise SpecError("environment.build_args", "expected an object of strings")
    if kind == "dockerfile":
        if not has_context:
            raise SpecError(
                "environment.dockerfile", "needs a build context: send multipart/form-data with a context part"
            )
        normal = posixpath.normpath(ref)
        if normal.startswith(("/", "..")) or normal == ".":
            raise SpecError("environment.dockerfile", "must be a path inside the build context")
        ref = normal
    return kind, ref, dict(build_args), _compose(value.get("compose"), kind, has_context)


def _compose(value, kind: str, has_context: bool) -> str | None:
    """The context's docker-compose file: beside an image or a Dockerfile (main's environment), the
    context being a Harbor task's environment/ folder, so the file is at its top, by Compose's name."""
    if value is None:
        return None
    if kind == "task_url":
        raise SpecError("environment.compose", "goes with image or dockerfile (a task_url's task brings its own)")
    if not has_context:
        raise SpecError("environment.compose", "needs a build context: send multipart/form-data with a context part")
    if not isinstance(value, str) or posixpath.normpath(value) not in COMPOSE_NAMES:
        raise SpecError(
            "environment.compose",
            f"expected {' or '.join(COMPOSE_NAMES)} at the top of the build context (a task's environment/ folder)",
        )
    return posixpath.normpath(value)


def _env(value) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_ENV:
        raise SpecError("env", f"expected an object of at most {MAX_ENV} string values")
    for key, item in value.items():
        check_variable(key, item, "env")
    return dict(value)


def check_variable(key, value, where: str) -> None:
    if not isinstance(key, str) or not key or "=" in key or "\0" in key:
        raise SpecError(where, f"bad variable name {key!r}")
    if not isinstance(value, str) or "\0" in value:
        raise SpecError(f"{where}.{key}", "expected a string without NUL")


def _workdir(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        raise SpecError("workdir", "expected an absolute path")
    return posixpath.normpath(value)


def _user(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 65536:
        return str(value)
    if isinstance(value, str) and value.strip() and len(value) <= 64 and "\0" not in value:
        return value.strip()
    raise SpecError("user", "expected a user name or a uid (0-65535)")


def _integer(body: dict, name: str, *, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(name, f"expected an integer of at least {minimum}")
    return value


def _number(body: dict, name: str, *, minimum: float, maximum: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not minimum <= value <= maximum:
        raise SpecError(name, f"expected a number between {minimum} and {maximum}")
    return float(value)
