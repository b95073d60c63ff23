"""One static asset and the rules it must keep (SPEC section 6).

An asset is ``name -> {path, save_path}``: ``path`` is where its source is,
relative to its base (``STATIC_ASSETS_ROOT``, or the task folder for task
assets); ``save_path`` is where it appears in the workspace, by default
``path``. ``parse_asset`` checks one asset and returns an ``Asset`` whose
``source`` is the resolved host path; ``check_together`` checks the assets
one evaluation will see, all groups merged. Every refusal is an
``AssetError`` whose message names the asset and the rule.

Choices where the contract is silent:

1. Names are 1 to 100 letters, digits, ``_``, ``-`` or ``.``, starting with
   a letter, digit or ``_``, so ``{{static:NAME}}`` can always be written and
   ``STATIC_ASSET_<NAME>`` stays a plain variable name.
2. Paths are normalised: empty and ``.`` components are dropped, so
   ``./x/./y`` is ``x/y`` and ``dir/`` is ``dir``. A component that is exactly
   ``..`` is refused (``a..b`` is an ordinary name). A path that normalises to
   nothing (``.``, ``./``) is refused: it would name the whole base (or, as a
   ``save_path``, the repository itself), never what anyone means.
3. Any ``save_path`` component equal to ``.git`` in any case is refused: it
   would write into the repository's (or a nested) git folder, and git itself
   refuses such paths.
4. Two assets may not share a ``save_path``, and one may not sit inside
   another's (``data`` and ``data/x``): the copies and the read-only mounts
   would overwrite each other. Two names giving the same ``STATIC_ASSET_``
   variable (``my-corpus`` and ``my_corpus``) are refused for the same reason.
5. The source must be a regular file or a folder (after following links that
   stay inside the base); a socket, a FIFO or a device is refused.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

MAX_NAME_CHARS = 100
MAX_PATH_CHARS = 1024
MAX_ASSETS = 256
ASSET_KEYS = ("path", "save_path")

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NOT_ENV = re.compile(r"[^A-Z0-9_]")


class AssetError(ValueError):
    """An asset (or a group of them) breaks a rule; the message names the asset and the rule."""


@dataclass(frozen=True)
class Asset:
    name: str
    path: str  # normalised, relative to the base
    save_path: str  # normalised, relative to the repository
    source: Path  # the resolved host path of the source, inside the base
    kind: str  # "file" or "dir"
    origin: str = ""  # "executor", "task" or "submission": where it was declared

    @property
    def env_name(self) -> str:
        return env_name(self.name)


def env_name(name: str) -> str:
    """``STATIC_ASSET_<NAME>``: the name upper-cased, every other character turned to ``_``."""
    return "STATIC_ASSET_" + _NOT_ENV.sub("_", name.upper())


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise AssetError(f"static asset name {name!r} must be a non-empty string")
    if len(name) > MAX_NAME_CHARS or not _NAME.fullmatch(name):
        raise AssetError(
            f"static asset name {name!r} must be 1 to {MAX_NAME_CHARS} letters, digits, '_', '-' or '.', "
            "not starting with '-' or '.'"
        )
    return name


def normalise(value: object, *, asset: str, key: str) -> str:
    """A relative path with empty and ``.`` components dropped; refuse the rest."""
    where = f"static asset {asset!r}: {key!r}"
    if not isinstance(value, str) or not value:
        raise AssetError(f"{where} must be a non-empty string, got {_shown(value)}")
    if len(value) > MAX_PATH_CHARS:
        raise AssetError(f"{where} is longer than {MAX_PATH_CHARS} characters")
    if _CONTROL.search(value):
        raise AssetError(f"{where} must not contain control characters, got {value!r}")
    if value.startswith("/"):
        raise AssetError(f"{where} must be a relative path, got the absolute path {value!r}")
    parts = [part for part in value.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise AssetError(f"{where} must not contain a '..' component, got {value!r}")
    if not parts:
        target = "the repository itself" if key == "save_path" else "the whole base folder"
        raise AssetError(f"{where} {value!r} names {target}; give a file or folder inside it")
    return "/".join(parts)


def parse_asset(name: object, spec: object, base: Path | None, *, base_label: str, origin: str = "") -> Asset:
    """Check one declared asset against ``base`` (the folder its ``path`` is relative to)."""
    name = check_name(name)
    if not isinstance(spec, Mapping):
        raise AssetError(
            f"static asset {name!r} must be a mapping with 'path' (and optionally 'save_path'), got {_shown(spec)}"
        )
    unknown = sorted(str(key) for key in spec if key not in ASSET_KEYS)
    if unknown:
        raise AssetError(f"static asset {name!r}: unknown key {unknown[0]!r} (an asset has 'path' and 'save_path')")
    if "path" not in spec:
        raise AssetError(f"static asset {name!r}: missing 'path'")
    path = normalise(spec["path"], asset=name, key="path")
    raw_save = spec.get("save_path")
    save_path = path if raw_save is None else normalise(raw_save, asset=name, key="save_path")
    if any(part.lower() == ".git" for part in save_path.split("/")):
        raise AssetError(f"static asset {name!r}: 'save_path' {save_path!r} collides with the repository's .git")
    if base is None:
        raise AssetError(f"static asset {name!r}: {base_label} is not set, so there is no folder to take it from")
    source, kind = resolve_source(name, path, base, base_label)
    return Asset(name=name, path=path, save_path=save_path, source=source, kind=kind, origin=origin)


def resolve_source(name: str, path: str, base: Path, base_label: str) -> tuple[Path, str]:
    """The real host path of ``base/path`` and its kind; it must exist inside ``base``."""
    real_base = os.path.realpath(base)
    real = os.path.realpath(os.path.join(real_base, path))  # links resolved, even dangling ones
    if not _inside(real, real_base):
        raise AssetError(
            f"static asset {name!r}: 'path' {path!r} resolves outside {base_label} through a symbolic link"
        )
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise AssetError(f"static asset {name!r}: 'path' {path!r} does not exist in {base_label}") from None
    except OSError as exc:
        raise AssetError(f"static asset {name!r}: 'path' {path!r} cannot be read: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        return Path(real), "dir"
    if stat.S_ISREG(st.st_mode):
        return Path(real), "file"
    raise AssetError(f"static asset {name!r}: 'path' {path!r} is neither a regular file nor a folder")


def check_together(assets: Iterable[Asset]) -> tuple[Asset, ...]:
    """The assets one workspace gets: no shared or nested save_path, no shared variable name."""
    assets = tuple(assets)
    if len(assets) > MAX_ASSETS:
        raise AssetError(f"at most {MAX_ASSETS} static assets are allowed, got {len(assets)}")
    by_save: dict[str, Asset] = {}
    by_env: dict[str, Asset] = {}
    for asset in assets:
        other = by_save.get(asset.save_path)
        if other is not None:
            raise AssetError(
                f"static assets {other.name!r} and {asset.name!r} have the same save_path {asset.save_path!r}"
            )
        by_save[asset.save_path] = asset
        other = by_env.get(asset.env_name)
        if other is not None:
            raise AssetError(f"static assets {other.name!r} and {asset.name!r} both give the variable {asset.env_name}")
        by_env[asset.env_name] = asset
    for save_path, asset in by_save.items():
        parts = save_path.split("/")
        for depth in range(1, len(parts)):
            outer = by_save.get("/".join(parts[:depth]))
            if outer is not None:
                raise AssetError(
                    f"static asset {asset.name!r}: 'save_path' {save_path!r} is inside the save_path "
                    f"{outer.save_path!r} of static asset {outer.name!r}"
                )
    return assets


def _inside(path: str, folder: str) -> bool:
    return path != folder and path.startswith(folder.rstrip("/") + "/")


def _shown(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, str):
        return repr(value)
    return {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "a mapping"}.get(
        type(value), type(value).__name__
    )
