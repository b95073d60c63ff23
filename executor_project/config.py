"""The one configuration object.

Every setting of the executor is read here, once, from the environment,
validated, and handed around as a frozen ``Config``. Nothing else in the
project reads ``os.environ`` for a setting.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import assets
from assets import Asset

PROJECT_DIR = Path(__file__).resolve().parent.parent

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(ValueError):
    """A bad environment value; the message names the variable."""


@dataclasses.dataclass(frozen=True)
class Config:
    port: int = 8080
    auth_tokens: tuple[str, ...] = ()
    database_url: str = ""
    data_dir: Path = PROJECT_DIR / "data"
    session_ttl_secs: int = 1800
    max_concurrent_evals: int = 4
    max_queued_evals: int = 0
    disk_quota_mb: int = 2048
    memory_limit_mb: int = 4096
    max_processes: int = 512
    clone_timeout_secs: int = 120
    install_timeout_secs: int = 600
    agent_timeout_secs: int = 600
    test_timeout_secs: int = 300
    download_timeout_secs: int = 60
    max_agent_code_bytes: int = 5242880
    max_output_bytes: int = 1048576
    max_task_archive_bytes: int = 104857600
    max_extracted_bytes: int = 524288000
    max_archive_members: int = 10000
    monitor_interval_ms: int = 100
    workspace_base: Path = Path("/tmp/sessions")
    sandbox: str = "auto"
    sandbox_uid: int = 60000  # the first of the per-evaluation uids (runtime/uids.py)
    sandbox_uid_count: int = 64
    agent_network: bool = True
    test_network: bool = False
    allow_file_urls: bool = False
    allow_private_urls: bool = False
    allowed_private_hosts: tuple[str, ...] = ()
    static_assets_root: Path | None = None
    static_assets_config: Path | None = None
    static_assets: tuple[Asset, ...] = ()  # the executor group, read from STATIC_ASSETS_CONFIG at start
    environments_root: Path | None = None  # root filesystems a task may run in (evaluations/environments.py)
    default_environment: str | None = None
    reap_interval_secs: int = 60
    retention_days: int = 0
    shutdown_grace_secs: int = 30
    worker_stale_secs: int = 30
    callback_secret: str = ""
    keep_workspaces: bool = False
    web_workers: int = 2
    log_format: str = "text"
    log_level: str = "INFO"

    @property
    def auth_enabled(self) -> bool:
        return bool(self.auth_tokens)

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
    def wake_socket(self) -> Path:
        """Datagram socket the worker listens on; the API pokes it on every write."""
        return self.data_dir / "worker.sock"


def _int(name: str, raw: str, minimum: int, maximum: int | None = None) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and at most {maximum}" if maximum is not None else ""
        raise ConfigError(f"{name}: must be at least {minimum}{upper}, got {value}")
    return value


def _bool(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{name}: expected on/off, true/false, yes/no or 1/0, got {raw!r}")


def _choice(name: str, raw: str, choices: tuple[str, ...]) -> str:
    value = raw.strip().lower()
    if value not in choices:
        raise ConfigError(f"{name}: expected one of {', '.join(choices)}, got {raw!r}")
    return value


def _list(raw: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def _path(name: str, raw: str) -> Path:
    if not raw.strip():
        raise ConfigError(f"{name}: must not be empty")
    return Path(raw.strip()).expanduser().absolute()


# name -> (field, parser). Parsers take (name, raw) and return the typed value.
_INTS = {
    # variable: (minimum, maximum)
    "PORT": (1, 65535),
    "SESSION_TTL_SECS": (1, None),
    "MAX_CONCURRENT_EVALS": (1, 1024),
    "MAX_QUEUED_EVALS": (0, None),
    "DISK_QUOTA_MB": (1, None),
    "MEMORY_LIMIT_MB": (16, None),
    "MAX_PROCESSES": (1, None),
    "CLONE_TIMEOUT_SECS": (1, None),
    "INSTALL_TIMEOUT_SECS": (1, None),
    "AGENT_TIMEOUT_SECS": (1, None),
    "TEST_TIMEOUT_SECS": (1, None),
    "DOWNLOAD_TIMEOUT_SECS": (1, None),
    "MAX_AGENT_CODE_BYTES": (1, None),
    "MAX_OUTPUT_BYTES": (1024, None),
    "MAX_TASK_ARCHIVE_BYTES": (1, None),
    "MAX_EXTRACTED_BYTES": (1, None),
    "MAX_ARCHIVE_MEMBERS": (1, None),
    "MONITOR_INTERVAL_MS": (10, 10000),
    "SANDBOX_UID": (1, 2**32 - 2),
    "SANDBOX_UID_COUNT": (1, 65536),
    "REAP_INTERVAL_SECS": (1, None),
    "RETENTION_DAYS": (0, None),
    "SHUTDOWN_GRACE_SECS": (0, None),
    "WORKER_STALE_SECS": (2, None),
    "WEB_WORKERS": (1, 64),
}
_BOOLS = (
    "AGENT_NETWORK",
    "TEST_NETWORK",
    "ALLOW_FILE_URLS",
    "ALLOW_PRIVATE_URLS",
    "KEEP_WORKSPACES",
)


def load(environ: dict[str, str] | os._Environ | None = None) -> Config:
    """Read and validate every setting; raise ConfigError naming the first bad variable."""
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for name, (minimum, maximum) in _INTS.items():
        if env.get(name, "") != "":
            values[name.lower()] = _int(name, env[name], minimum, maximum)
    for name in _BOOLS:
        if env.get(name, "") != "":
            values[name.lower()] = _bool(name, env[name])
    if env.get("AUTH_TOKEN", "").strip():
        values["auth_tokens"] = _list(env["AUTH_TOKEN"])
    if env.get("DATABASE_URL", "").strip():
        values["database_url"] = env["DATABASE_URL"].strip()
    for name in ("DATA_DIR", "WORKSPACE_BASE"):
        if name in env:
            values[name.lower()] = _path(name, env[name])
    for name in ("STATIC_ASSETS_ROOT", "STATIC_ASSETS_CONFIG"):
        if env.get(name, "").strip():
            values[name.lower()] = _path(name, env[name])
    if env.get("SANDBOX", "") != "":
        values["sandbox"] = _choice("SANDBOX", env["SANDBOX"], ("auto", "bwrap", "none"))
    if env.get("LOG_FORMAT", "") != "":
        values["log_format"] = _choice("LOG_FORMAT", env["LOG_FORMAT"], ("text", "json"))
    if env.get("LOG_LEVEL", "") != "":
        values["log_level"] = _choice("LOG_LEVEL", env["LOG_LEVEL"], ("debug", "info", "warning", "error")).upper()
    values["allowed_private_hosts"] = tuple(h.lower() for h in _list(env.get("ALLOWED_PRIVATE_HOSTS", "")))
    values["callback_secret"] = env.get("CALLBACK_SECRET", "")
    if env.get("ENVIRONMENTS_ROOT", "").strip():
        values["environments_root"] = _path("ENVIRONMENTS_ROOT", env["ENVIRONMENTS_ROOT"])
    if env.get("DEFAULT_ENVIRONMENT", "").strip():
        values["default_environment"] = env["DEFAULT_ENVIRONMENT"].strip()
    config = Config(**values)
    _check_environments(config)
    if config.static_assets_config and not config.static_assets_config.is_file():
        raise ConfigError(f"STATIC_ASSETS_CONFIG: no such file {config.static_assets_config}")
    if config.static_assets_root and not config.static_assets_root.is_dir():
        raise ConfigError(f"STATIC_ASSETS_ROOT: no such folder {config.static_assets_root}")
    if config.sandbox_uid + config.sandbox_uid_count - 1 > 2**32 - 2:
        raise ConfigError("SANDBOX_UID_COUNT: SANDBOX_UID + SANDBOX_UID_COUNT - 1 must stay below 4294967295")
    if config.sandbox_uid_count < config.max_concurrent_evals:
        raise ConfigError(
            f"SANDBOX_UID_COUNT: must be at least MAX_CONCURRENT_EVALS ({config.max_concurrent_evals}): "
            f"each running evaluation needs a uid of its own, got {config.sandbox_uid_count}"
        )
    if config.static_assets_config and not config.static_assets_root:
        raise ConfigError("STATIC_ASSETS_CONFIG: needs STATIC_ASSETS_ROOT, the base of its paths")
    if config.static_assets_config:
        try:
            executor_assets = assets.load_config_file(config.static_assets_config, config.static_assets_root)
        except assets.AssetError as exc:
            raise ConfigError(f"STATIC_ASSETS_CONFIG: {exc}") from None
        config = dataclasses.replace(config, static_assets=executor_assets)
    return config


def _check_environments(config: Config) -> None:
    from evaluations import environments  # plain Python, below Django like assets

    if config.environments_root and not config.environments_root.is_dir():
        raise ConfigError(f"ENVIRONMENTS_ROOT: no such folder {config.environments_root}")
    if config.default_environment and not config.environments_root:
        raise ConfigError("DEFAULT_ENVIRONMENT: needs ENVIRONMENTS_ROOT, the folder environments are in")
    if config.default_environment:
        try:
            environments.resolve(config.environments_root, config.default_environment)
        except environments.BadEnvironment as exc:
            raise ConfigError(f"DEFAULT_ENVIRONMENT: {exc}") from None


def close_to_others(folder: Path) -> None:
    """Mode 0700 on the data folder: commands run as other uids and must not read the SQLite
    file, the secret key or the sockets in it, whatever mode the files themselves got."""
    try:
        if folder.stat().st_uid == os.geteuid():
            os.chmod(folder, 0o700)
    except OSError:
        pass  # not ours to change: the start-up checks warn if the sandbox uid can get in


def secret_key(config: Config) -> str:
    """Django's signing key: $SECRET_KEY, else one generated once and kept in the data folder."""
    explicit = os.environ.get("SECRET_KEY", "")
    if explicit:
        return explicit
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
