"""The settings as the service runs with them: executor_project.config's values and rules, then
the rules that need the app's own parsers (egress rules, environments). config.py stays below the
app and imports none of it; this module sits above both, as settings.py does."""

from __future__ import annotations

from collections.abc import Mapping

from evaluations import environments
from evaluations.images import reference
from evaluations.images.errors import ImageError
from evaluations.network.egress import egress_policy
from evaluations.tasks.readers import environment_choice
from evaluations.tasks.spec import TaskError
from executor_project.config import Config, ConfigError
from executor_project.config import load as load_values


def load(environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate every setting; raise ConfigError naming the first bad variable."""
    config = load_values(environ)
    try:
        egress_policy(config)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _check_environments(config)
    _check_image_rewrites(config)
    return config


def _check_image_rewrites(config: Config) -> None:
    """IMAGE_REWRITES: both sides image references; a reference rewritten once (``python:3.12`` and
    ``docker.io/library/python:3.12`` are the same one)."""
    seen: list[tuple[str, reference.Reference]] = []
    for position, (source, target) in enumerate(config.image_rewrites, start=1):
        try:
            parsed, _ = (reference.parse(side, config.image_default_registry) for side in (source, target))
        except ImageError as exc:
            raise ConfigError(f"IMAGE_REWRITES: entry {position}: {exc}") from None
        for written, earlier in seen:
            if reference.same(parsed, earlier):
                raise ConfigError(
                    f"IMAGE_REWRITES: entry {position}: {source!r} is {written!r} again (one rewrite each)"
                )
        seen.append((source, parsed))


def _check_environments(config: Config) -> None:
    if config.environments_root and not config.environments_root.is_dir():
        raise ConfigError(f"ENVIRONMENTS_ROOT: no such folder {config.environments_root}")
    if config.default_environment and not config.environments_root:
        raise ConfigError("DEFAULT_ENVIRONMENT: needs ENVIRONMENTS_ROOT, the folder environments are in")
    if config.default_environment:
        try:
            environments.resolve(config.environments_root, config.default_environment)
        except environments.BadEnvironment as exc:
            raise ConfigError(f"DEFAULT_ENVIRONMENT: {exc}") from None
    for language, value in config.language_environments:
        where = f"LANGUAGE_ENVIRONMENTS: {language}"
        try:
            choice = environment_choice(value, where)
        except TaskError as exc:
            raise ConfigError(str(exc)) from None
        if isinstance(choice, str):  # a name: it must be there now, as DEFAULT_ENVIRONMENT's
            if not config.environments_root:
                raise ConfigError(
                    f"{where}: environment {value} needs ENVIRONMENTS_ROOT, the folder environments are in"
                )
            try:
                environments.resolve(config.environments_root, choice)
            except environments.BadEnvironment as exc:
                raise ConfigError(f"{where}: {exc}") from None
