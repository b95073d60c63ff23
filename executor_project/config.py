"""The one configuration object.

Every setting of the executor is read here, once, from the environment,
validated, and handed around as a frozen ``Config``. Nothing else in the
project reads ``os.environ`` for a setting.

Each setting is one field of ``Config``, declared with its variable, parser,
bounds and default on one line (``integer``, ``boolean``, ``choice``,
``strings``, ``tenants``, ``text``, ``path``, ``optional_path``); ``load()`` walks the
fields. Adding a setting is adding a line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import assets
from assets import Asset

PROJECT_DIR = Path(__file__).resolve().parent.parent

# Where distributions keep the CAs the host trusts, as one file: Debian, Ubuntu and Alpine;
# Fedora and RHEL; openSUSE; the BSDs and Alpine's other name.
CA_BUNDLE_PATHS = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(ValueError):
    """A bad environment value; the message names the variable."""


# -- how a variable is read ----------------------------------------------------------------------
# Each function below declares one setting: a dataclass field whose metadata holds the variable's
# name and its parser, parse(name, raw) -> value. An unset or empty variable keeps the default,
# except for a required path (``path``), where an empty value is a mistake worth stopping for.


def _field(env: str, default, parse: Callable[[str, str], object], *, empty_is_default=True, secret=False):
    metadata = {"env": env, "parse": parse, "empty_is_default": empty_is_default}
    return dataclasses.field(default=default, metadata=metadata, repr=not secret)


def integer(env: str, default: int, *, minimum: int, maximum: int | None = None):
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            upper = f" and at most {maximum}" if maximum is not None else ""
            raise ConfigError(f"{name}: must be at least {minimum}{upper}, got {value}")
        return value

    return _field(env, default, parse)


def boolean(env: str, default: bool):
    def parse(name: str, raw: str) -> bool:
        lowered = raw.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ConfigError(f"{name}: expected on/off, true/false, yes/no or 1/0, got {raw!r}")

    return _field(env, default, parse)


def choice(env: str, default: str, choices: tuple[str, ...]):
    """One of ``choices``, in any case; the value is the choice as written here."""
    by_lower = {option.lower(): option for option in choices}

    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in by_lower:
            raise ConfigError(f"{name}: expected one of {', '.join(by_lower)}, got {raw!r}")
        return by_lower[value]

    return _field(env, default, parse)


def strings(env: str, default: tuple[str, ...] = (), *, lower: bool = False, secret: bool = False):
    """A comma-separated list; blanks between commas are dropped (a value of only blanks is the empty list)."""

    def parse(name: str, raw: str) -> tuple[str, ...]:
        items = tuple(item.strip() for item in raw.split(",") if item.strip())
        return tuple(item.lower() for item in items) if lower else items

    return _field(env, default, parse, secret=secret)


TENANT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def tenants(env: str):
    """``name:token,...``: named tokens, each seeing only what it created (SPEC §20). A name is
    TENANT_NAME; the token is everything after the first colon. Names and tokens are unique.
    Messages name the tenant, never print a token."""

    def parse(name: str, raw: str) -> tuple[tuple[str, str], ...]:
        pairs: list[tuple[str, str]] = []
        for position, item in enumerate((item.strip() for item in raw.split(",") if item.strip()), start=1):
            tenant, colon, token = item.partition(":")
            tenant, token = tenant.strip(), token.strip()
            if not colon or not token:
                raise ConfigError(f"{name}: entry {position} must be name:token (a name, a colon, a token)")
            if not TENANT_NAME.fullmatch(tenant):
                # Not echoed: an entry written token:name the wrong way round would print the token.
                raise ConfigError(f"{name}: entry {position}: a tenant name is 1 to 64 of A-Z a-z 0-9 _ . -")
            if any(tenant == known for known, _ in pairs):
                raise ConfigError(f"{name}: the tenant name {tenant!r} is listed twice; names must be unique")
            if any(token == known for _, known in pairs):
                raise ConfigError(
                    f"{name}: tenant {tenant!r} has the same token as another tenant; tokens must be unique"
                )
            pairs.append((tenant, token))
        return tuple(pairs)

    return _field(env, (), parse, secret=True)


# SPEC §19: the languages a task's `language:` may ask a toolchain for, and Python versions
# (a task's install_config `python`), as LANGUAGE_ENVIRONMENTS keys.
TASK_LANGUAGES = ("go", "rust", "javascript", "typescript", "java", "python")
_PYTHON_VERSION_KEY = re.compile(r"python[0-9]+\.[0-9]+")


def language_environments(env: str):
    """``language=name-or-image,...`` (SPEC §19): the environment of a task of that language that names
    none. A language is one of TASK_LANGUAGES or ``pythonX.Y``, each listed once. The values (an
    environment name, or an image reference) are checked by settings_loader, which knows both forms."""

    def parse(name: str, raw: str) -> tuple[tuple[str, str], ...]:
        pairs: list[tuple[str, str]] = []
        for position, item in enumerate((item.strip() for item in raw.split(",") if item.strip()), start=1):
            language, equals, value = (part.strip() for part in item.partition("="))
            language = language.lower()
            if not equals or not language or not value:
                raise ConfigError(f"{name}: entry {position} must be language=environment, got {item!r}")
            if language not in TASK_LANGUAGES and not _PYTHON_VERSION_KEY.fullmatch(language):
                raise ConfigError(
                    f"{name}: entry {position}: unknown language {language!r} "
                    f"(one of {', '.join(TASK_LANGUAGES)}, or pythonX.Y for a Python version)"
                )
            if any(language == known for known, _ in pairs):
                raise ConfigError(f"{name}: the language {language!r} is listed twice")
            pairs.append((language, value))
        return tuple(pairs)

    return _field(env, (), parse)


def image_rewrites(env: str):
    """``ref=ref,...`` (SPEC §22): an image reference replaced by another before any pull, for hosts
    that reach only their own registry. Each entry is two references joined by ``=``; their grammar,
    and that no reference is listed twice once read as references, is checked by settings_loader
    (evaluations/images/reference.py reads references, and config.py imports no app module)."""

    def parse(name: str, raw: str) -> tuple[tuple[str, str], ...]:
        pairs: list[tuple[str, str]] = []
        for position, item in enumerate((item.strip() for item in raw.split(",") if item.strip()), start=1):
            source, equals, target = (part.strip() for part in item.partition("="))
            if not equals or not source or not target or "=" in target:
                raise ConfigError(f"{name}: entry {position} must be ref=ref (two image references), got {item!r}")
            pairs.append((source, target))
        return tuple(pairs)

    return _field(env, (), parse)


def text(env: str, default: str = "", *, strip: bool = True, secret: bool = False):
    def parse(name: str, raw: str) -> str:
        value = raw.strip() if strip else raw
        return value or default

    return _field(env, default, parse, secret=secret)


def _absolute(name: str, raw: str) -> Path:
    if not raw.strip():
        raise ConfigError(f"{name}: must not be empty")
    return Path(raw.strip()).expanduser().absolute()


def path(env: str, default: Path):
    """A folder or file the executor needs: set to an empty value, it stops start-up."""
    return _field(env, default, _absolute, empty_is_default=False)


def optional_path(env: str, default: Path | None = None):
    """A path that may be left out: unset or blank is ``default``."""
    return _field(env, default, lambda name, raw: _absolute(name, raw) if raw.strip() else default)


def distribution_ca_bundle() -> Path | None:
    return next((Path(path) for path in CA_BUNDLE_PATHS if os.path.isfile(path)), None)


@dataclasses.dataclass(frozen=True)
class Config:
    port: int = integer("PORT", 8080, minimum=1, maximum=65535)
    gunicorn_bind: str = text("GUNICORN_BIND")  # empty: 0.0.0.0:PORT (see bind)
    web_workers: int = integer("WEB_WORKERS", 2, minimum=1, maximum=64)
    auth_tokens: tuple[str, ...] = strings("AUTH_TOKEN", secret=True)  # operators': they see every evaluation
    tenant_tokens: tuple[tuple[str, str], ...] = tenants("AUTH_TOKENS")  # (name, token): each sees its own
    secret_key: str = text("SECRET_KEY", strip=False, secret=True)  # empty: one kept in DATA_DIR (django_secret_key)
    database_url: str = text("DATABASE_URL", secret=True)
    data_dir: Path = path("DATA_DIR", PROJECT_DIR / "data")
    session_ttl_secs: int = integer("SESSION_TTL_SECS", 1800, minimum=1)
    max_concurrent_evals: int = integer("MAX_CONCURRENT_EVALS", 4, minimum=1, maximum=1024)
    eval_process_reuses: int = integer("EVAL_PROCESS_REUSES", 100, minimum=1)  # worker/pool.py; 1: a fresh process each
    max_queued_evals: int = integer("MAX_QUEUED_EVALS", 0, minimum=0)
    disk_quota_mb: int = integer("DISK_QUOTA_MB", 2048, minimum=1)
    max_files: int = integer("MAX_FILES", 100000, minimum=1)  # inodes in a session, as DISK_QUOTA_MB its bytes
    memory_limit_mb: int = integer("MEMORY_LIMIT_MB", 4096, minimum=16)
    max_processes: int = integer("MAX_PROCESSES", 512, minimum=1)
    clone_timeout_secs: int = integer("CLONE_TIMEOUT_SECS", 120, minimum=1)
    install_timeout_secs: int = integer("INSTALL_TIMEOUT_SECS", 600, minimum=1)
    agent_timeout_secs: int = integer("AGENT_TIMEOUT_SECS", 600, minimum=1)
    test_timeout_secs: int = integer("TEST_TIMEOUT_SECS", 300, minimum=1)
    download_timeout_secs: int = integer("DOWNLOAD_TIMEOUT_SECS", 60, minimum=1)
    max_agent_code_bytes: int = integer("MAX_AGENT_CODE_BYTES", 5242880, minimum=1)
    max_agent_archive_bytes: int = integer("MAX_AGENT_ARCHIVE_BYTES", 10485760, minimum=1)  # decoded, SPEC §14
    max_batch_tasks: int = integer("MAX_BATCH_TASKS", 100, minimum=1, maximum=10000)
    max_open_batches: int = integer("MAX_OPEN_BATCHES", 4, minimum=1)
    max_attempts: int = integer("MAX_ATTEMPTS", 10, minimum=1, maximum=100)  # SPEC §17 pass@k, per task URL
    # SPEC §17: what the agent leaves under /logs/agent, kept per evaluation (bytes, all files together).
    max_artifact_bytes: int = integer("MAX_ARTIFACT_BYTES", 50 * 1024 * 1024, minimum=0)
    # SPEC §18: the Ed25519 key results are signed with (unset: one made in DATA_DIR/signing), and
    # event streams: how many may be open at once on this host, the keep-alive comment's interval,
    # how long a write to a client that stopped reading may block before the stream is dropped.
    signing_key_file: Path | None = optional_path("SIGNING_KEY_FILE")
    max_event_streams: int = integer("MAX_EVENT_STREAMS", 200, minimum=1, maximum=10000)
    # SPEC §21: how many of those one named token may hold (unset: event_streams_per_token, a quarter);
    # operators' tokens are held only to MAX_EVENT_STREAMS.
    max_event_streams_per_token: int | None = integer("MAX_EVENT_STREAMS_PER_TOKEN", None, minimum=1, maximum=10000)
    event_keepalive_secs: int = integer("EVENT_KEEPALIVE_SECS", 15, minimum=1, maximum=3600)
    event_send_timeout_secs: int = integer("EVENT_SEND_TIMEOUT_SECS", 30, minimum=1, maximum=3600)
    max_output_bytes: int = integer("MAX_OUTPUT_BYTES", 1048576, minimum=1024)
    max_task_archive_bytes: int = integer("MAX_TASK_ARCHIVE_BYTES", 104857600, minimum=1)
    max_extracted_bytes: int = integer("MAX_EXTRACTED_BYTES", 524288000, minimum=1)
    max_archive_members: int = integer("MAX_ARCHIVE_MEMBERS", 10000, minimum=1)
    # What a task may bring (SPEC §20), checked at downloading_task: bytes of each prompt text
    # (prompt.md, original_pr.md; instruction.md too once Harbor tasks are read) and tests
    # (tests/*.sh scripts and checks.txt commands together).
    max_prompt_bytes: int = integer("MAX_PROMPT_BYTES", 262144, minimum=1)
    max_tests: int = integer("MAX_TESTS", 1000, minimum=1)
    monitor_interval_ms: int = integer("MONITOR_INTERVAL_MS", 100, minimum=10, maximum=10000)
    workspace_base: Path = path("WORKSPACE_BASE", Path("/tmp/sessions"))
    sandbox: str = choice("SANDBOX", "auto", ("auto", "bwrap", "none"))
    # The first of the per-evaluation uids (runtime/uids.py), and how many there are.
    sandbox_uid: int = integer("SANDBOX_UID", 60000, minimum=1, maximum=2**32 - 2)
    sandbox_uid_count: int = integer("SANDBOX_UID_COUNT", 64, minimum=1, maximum=65536)
    # Commands in an image (SPEC §16): each uid of the pool owns 65536 host ids from here on
    # (runtime/idmap.py), its image's ids other than its User's; no account may use them.
    image_uid_base: int = integer("IMAGE_UID_BASE", 100_000_000, minimum=65536, maximum=2**32 - 2)
    agent_network: bool = boolean("AGENT_NETWORK", True)
    test_network: bool = boolean("TEST_NETWORK", False)
    allow_file_urls: bool = boolean("ALLOW_FILE_URLS", False)
    allow_private_urls: bool = boolean("ALLOW_PRIVATE_URLS", False)
    allowed_private_hosts: tuple[str, ...] = strings("ALLOWED_PRIVATE_HOSTS", lower=True)
    # What commands with network may reach through the egress proxy (evaluations/egress/policy.py).
    egress_allow: tuple[str, ...] = strings("EGRESS_ALLOW")
    egress_deny: tuple[str, ...] = strings("EGRESS_DENY")
    # What a destination EGRESS_ALLOW does not name gets: public addresses (SPEC §12), or nothing (a closed list).
    egress_default: str = choice("EGRESS_DEFAULT", "public", ("public", "deny"))
    static_assets_root: Path | None = optional_path("STATIC_ASSETS_ROOT")
    static_assets_config: Path | None = optional_path("STATIC_ASSETS_CONFIG")
    # Root filesystems a task may run in (evaluations/environments/), and the one used by default.
    environments_root: Path | None = optional_path("ENVIRONMENTS_ROOT")
    default_environment: str | None = text("DEFAULT_ENVIRONMENT", None)
    # SPEC §19: per task language (go=NAME_OR_IMAGE,...), the environment of a task that names none.
    language_environments: tuple[tuple[str, str], ...] = language_environments("LANGUAGE_ENVIRONMENTS")
    reap_interval_secs: int = integer("REAP_INTERVAL_SECS", 60, minimum=1)
    retention_days: int = integer("RETENTION_DAYS", 0, minimum=0)
    shutdown_grace_secs: int = integer("SHUTDOWN_GRACE_SECS", 30, minimum=0)
    worker_stale_secs: int = integer("WORKER_STALE_SECS", 30, minimum=2)
    callback_secret: str = text("CALLBACK_SECRET", strip=False, secret=True)
    keep_workspaces: bool = boolean("KEEP_WORKSPACES", False)
    log_format: str = choice("LOG_FORMAT", "text", ("text", "json"))
    log_level: str = choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))
    # Warm evaluations (SPEC §13): install snapshots and repository mirrors, on this host's disk.
    workspace_cache: str = choice("WORKSPACE_CACHE", "on", ("on", "off"))
    cache_dir: Path | None = optional_path("CACHE_DIR")  # unset: DATA_DIR/cache (see cache_root)
    cache_max_bytes: int = integer("CACHE_MAX_BYTES", 20 * 1024**3, minimum=0)
    cache_max_files: int = integer("CACHE_MAX_FILES", 2000000, minimum=0)  # inodes, as CACHE_MAX_BYTES bytes
    cache_max_age_secs: int = integer("CACHE_MAX_AGE_SECS", 604800, minimum=1)
    # Images (SPEC §16): where references without a host go, mirrors (registry=mirror,...), registries
    # reached over plain HTTP (host:port,...), credentials, the store and its size, how long a tag holds.
    image_default_registry: str = text("IMAGE_DEFAULT_REGISTRY", "docker.io")
    image_registry_mirrors: tuple[str, ...] = strings("IMAGE_REGISTRY_MIRRORS", lower=True)
    image_insecure_registries: tuple[str, ...] = strings("IMAGE_INSECURE_REGISTRIES", lower=True)
    # SPEC §22: references replaced before pulling (from=to,...), for hosts that reach only their own registry.
    image_rewrites: tuple[tuple[str, str], ...] = image_rewrites("IMAGE_REWRITES")
    registry_auth_file: Path | None = optional_path("REGISTRY_AUTH_FILE")
    images_dir: Path | None = optional_path("IMAGES_DIR")  # unset: DATA_DIR/images (see images_root)
    images_max_bytes: int = integer("IMAGES_MAX_BYTES", 50 * 1024**3, minimum=0)
    image_tag_ttl_secs: int = integer("IMAGE_TAG_TTL_SECS", 3600, minimum=0)
    # SPEC §21: what one image may unpack to (its layers together, a sparse file by its size), a pull's
    # whole deadline, and how long one layer fetch may receive nothing before it is given up.
    image_max_unpacked_bytes: int = integer("IMAGE_MAX_UNPACKED_BYTES", 20 * 1024**3, minimum=1)
    image_max_files: int = integer("IMAGE_MAX_FILES", 1_000_000, minimum=1)
    image_pull_timeout_secs: int = integer("IMAGE_PULL_TIMEOUT_SECS", 1800, minimum=1)
    image_fetch_stall_secs: int = integer("IMAGE_FETCH_STALL_SECS", 60, minimum=1)
    build_timeout_secs: int = integer("BUILD_TIMEOUT_SECS", 1800, minimum=1)
    build_network: str = choice("BUILD_NETWORK", "on", ("on", "off"))
    # The CAs commands trust: unset, the distribution's bundle, found once at import.
    ca_bundle: Path | None = optional_path("SSL_CERT_FILE", distribution_ca_bundle())
    # SPEC §24: live sandboxes on this host, how long POST /sandboxes waits for one to be ready before
    # answering 202, the largest build context it takes, and this host's own address in a fleet (a
    # request for a sandbox made elsewhere is redirected to its host's PUBLIC_URL).
    max_sandboxes: int = integer("MAX_SANDBOXES", 32, minimum=0, maximum=4096)
    sandbox_create_wait_secs: int = integer("SANDBOX_CREATE_WAIT_SECS", 20, minimum=0, maximum=3600)
    max_context_bytes: int = integer("MAX_CONTEXT_BYTES", 512 * 1024 * 1024, minimum=1)
    public_url: str = text("PUBLIC_URL")
    # Images whose sandboxes are made ahead (SANDBOX_WARM_COUNT each, counted in MAX_SANDBOXES), so
    # that POST /sandboxes for one of them takes a started sandbox instead of starting one.
    sandbox_warm_images: tuple[str, ...] = strings("SANDBOX_WARM_IMAGES")
    sandbox_warm_count: int = integer("SANDBOX_WARM_COUNT", 1, minimum=0, maximum=64)
    # Not a variable: the executor's group of assets, read from STATIC_ASSETS_CONFIG by load().
    static_assets: tuple[Asset, ...] = ()

    @property
    def bind(self) -> str:
        """Where gunicorn listens."""
        return self.gunicorn_bind or f"0.0.0.0:{self.port}"

    @property
    def cgroup_parent(self) -> str:
        """Our cgroup folder: one per service (its DATA_DIR), so services sharing a host never reap
        each other's evaluations."""
        return "term-executor-" + hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:8]

    @property
    def auth_enabled(self) -> bool:
        return bool(self.auth_tokens or self.tenant_tokens)

    @property
    def event_streams_per_token(self) -> int:
        """MAX_EVENT_STREAMS_PER_TOKEN, else a quarter of MAX_EVENT_STREAMS (at least 1): one tenant
        never holds every stream of the host."""
        return self.max_event_streams_per_token or max(1, self.max_event_streams // 4)

    @property
    def admission_limit(self) -> int:
        """Pending plus running evaluations at which POST /evaluate answers 503."""
        return self.max_concurrent_evals + self.max_queued_evals

    @property
    def memory_limit_bytes(self) -> int:
        return self.memory_limit_mb * 1024 * 1024

    @property
    def disk_quota_bytes(self) -> int:
        return self.disk_quota_mb * 1024 * 1024

    @property
    def cache_root(self) -> Path:
        return self.cache_dir or self.data_dir / "cache"

    @property
    def images_root(self) -> Path:
        return self.images_dir or self.data_dir / "images"

    @property
    def registry_mirrors(self) -> dict[str, tuple[str, ...]]:
        """IMAGE_REGISTRY_MIRRORS as {registry: (mirror, ...)}, in the order given (checked by load)."""
        mirrors: dict[str, tuple[str, ...]] = {}
        for item in self.image_registry_mirrors:
            registry, _, mirror = item.partition("=")
            mirrors[registry.strip()] = (*mirrors.get(registry.strip(), ()), mirror.strip())
        return mirrors

    @property
    def language_environment(self) -> dict[str, str]:
        """LANGUAGE_ENVIRONMENTS as {language: name or image reference}."""
        return dict(self.language_environments)

    @property
    def wake_socket(self) -> Path:
        """Datagram socket the worker listens on; the API pokes it on every write."""
        return self.data_dir / "worker.sock"


SETTINGS = tuple(field for field in dataclasses.fields(Config) if "env" in field.metadata)


def load(environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate every setting; raise ConfigError naming the first bad variable."""
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for field in SETTINGS:
        name = field.metadata["env"]
        raw = env.get(name)
        if raw is None or (raw == "" and field.metadata["empty_is_default"]):
            continue
        values[field.name] = field.metadata["parse"](name, raw)
    config = Config(**values)
    _check_together(config)
    if config.static_assets_config:
        try:
            executor_assets = assets.load_config_file(config.static_assets_config, config.static_assets_root)
        except assets.AssetError as exc:
            raise ConfigError(f"STATIC_ASSETS_CONFIG: {exc}") from None
        config = dataclasses.replace(config, static_assets=executor_assets)
    return config


def _check_together(config: Config) -> None:
    """The rules that involve more than one variable, or the file system."""
    for tenant, token in config.tenant_tokens:
        if token in config.auth_tokens:
            raise ConfigError(
                f"AUTH_TOKENS: tenant {tenant!r} has a token that is also in AUTH_TOKEN; a token is either an "
                "operator's (AUTH_TOKEN) or one tenant's (AUTH_TOKENS)"
            )
    if config.ca_bundle and not config.ca_bundle.is_file():
        raise ConfigError(f"SSL_CERT_FILE: no such file {config.ca_bundle} (the CA bundle commands are told to trust)")
    if config.static_assets_config and not config.static_assets_config.is_file():
        raise ConfigError(f"STATIC_ASSETS_CONFIG: no such file {config.static_assets_config}")
    if config.static_assets_root and not config.static_assets_root.is_dir():
        raise ConfigError(f"STATIC_ASSETS_ROOT: no such folder {config.static_assets_root}")
    if (config.max_event_streams_per_token or 0) > config.max_event_streams:
        raise ConfigError(
            f"MAX_EVENT_STREAMS_PER_TOKEN: must be at most MAX_EVENT_STREAMS ({config.max_event_streams}), "
            f"got {config.max_event_streams_per_token}"
        )
    if config.sandbox_uid + config.sandbox_uid_count - 1 > 2**32 - 2:
        raise ConfigError("SANDBOX_UID_COUNT: SANDBOX_UID + SANDBOX_UID_COUNT - 1 must stay below 4294967295")
    image_ids_end = config.image_uid_base + config.sandbox_uid_count * 65536
    if image_ids_end > 2**32 - 1:
        raise ConfigError("IMAGE_UID_BASE: IMAGE_UID_BASE + SANDBOX_UID_COUNT x 65536 must stay below 4294967295")
    pool = range(config.sandbox_uid, config.sandbox_uid + config.sandbox_uid_count)
    if pool.start < image_ids_end and config.image_uid_base < pool.stop:
        raise ConfigError(
            f"IMAGE_UID_BASE: the image id ranges ({config.image_uid_base}-{image_ids_end - 1}) overlap "
            f"the SANDBOX_UID pool ({pool.start}-{pool.stop - 1})"
        )
    if config.sandbox_uid_count < config.max_concurrent_evals:
        raise ConfigError(
            f"SANDBOX_UID_COUNT: must be at least MAX_CONCURRENT_EVALS ({config.max_concurrent_evals}): "
            f"each running evaluation needs a uid of its own, got {config.sandbox_uid_count}"
        )
    _check_images(config)
    if config.static_assets_config and not config.static_assets_root:
        raise ConfigError("STATIC_ASSETS_CONFIG: needs STATIC_ASSETS_ROOT, the base of its paths")


_REGISTRY_HOST = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?|\[[0-9a-f:.]+\](:[0-9]{1,5})?")


def _check_images(config: Config) -> None:
    """Registry hosts are host[:port]; a mirror entry is registry=mirror; the auth file exists."""
    if not _REGISTRY_HOST.fullmatch(config.image_default_registry.lower()):
        raise ConfigError(f"IMAGE_DEFAULT_REGISTRY: expected host[:port], got {config.image_default_registry!r}")
    for item in config.image_registry_mirrors:
        registry, equals, mirror = (part.strip() for part in item.partition("="))
        if not equals or not _REGISTRY_HOST.fullmatch(registry) or not _REGISTRY_HOST.fullmatch(mirror):
            raise ConfigError(f"IMAGE_REGISTRY_MIRRORS: each entry is registry=mirror (host[:port] each), got {item!r}")
    for host in config.image_insecure_registries:
        if not _REGISTRY_HOST.fullmatch(host):
            raise ConfigError(f"IMAGE_INSECURE_REGISTRIES: expected host[:port] entries, got {host!r}")
    if config.registry_auth_file and not config.registry_auth_file.is_file():
        raise ConfigError(f"REGISTRY_AUTH_FILE: no such file {config.registry_auth_file}")


def close_to_others(folder: Path) -> None:
    """Mode 0700 on the data folder: commands run as other uids and must not read the SQLite
    file, the secret key or the sockets in it, whatever mode the files themselves got."""
    try:
        if folder.stat().st_uid == os.geteuid():
            os.chmod(folder, 0o700)
    except OSError:
        pass  # not ours to change: the start-up checks warn if the sandbox uid can get in


def django_secret_key(config: Config) -> str:
    """Django's signing key: SECRET_KEY, else one generated once and kept in the data folder."""
    if config.secret_key:
        return config.secret_key
    path = config.data_dir / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    import secrets

    key = secrets.token_urlsafe(50)
    config.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process won the race
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(key)
    return key
