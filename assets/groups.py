"""Groups of assets and how they combine (SPEC section 6).

A declaration (the ``STATIC_ASSETS_CONFIG`` file, a task's ``static_assets``,
a submission's ``static_assets``) is one of two shapes:

1. flat: ``{name: {path, save_path}, ...}``, one group;
2. grouped: ``{ordering: [g1, g2], g1: {name: {...}}, g2: {...}}``, named
   groups combined in ``ordering``'s order, a later group winning by name.

Anything between the two is refused, never read as an empty group: assets
and groups side by side, an ``ordering`` naming no group (or missing a
group), an ``ordering`` without groups, or groups without an ``ordering``.
An entry is a group when its value is a non-empty mapping of mappings with
neither ``path`` nor ``save_path`` among its keys; ``ordering`` is reserved.

The three declarations then combine lowest first: executor < task <
submission, a later one winning by name (``merge``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import yaml

from assets.model import ASSET_KEYS, MAX_ASSETS, Asset, AssetError, check_together, parse_asset

ORDERING = "ordering"
MAX_CONFIG_BYTES = 1024 * 1024


def resolve(declared: object, base: Path | None, *, base_label: str, origin: str) -> dict[str, Asset]:
    """One declaration (flat or grouped) -> its assets by name, each checked against ``base``."""
    if declared is None:
        return {}
    if not isinstance(declared, Mapping):
        raise AssetError(f"{origin} static assets must be a mapping of names to assets (or of named groups)")
    if ORDERING in declared:
        groups = _grouped(declared, origin)
    else:
        kinds = {name: _kind(value) for name, value in declared.items()}
        group_names = [name for name, kind in kinds.items() if kind == "group"]
        if group_names:
            assets = [name for name, kind in kinds.items() if kind != "group"]
            if assets:
                raise _mixed(origin, assets[0], group_names[0])
            raise AssetError(
                f"{origin} static assets: named groups ({', '.join(map(repr, group_names))}) need an "
                f"'{ORDERING}' list saying which wins"
            )
        groups = [declared]
    declared_count = sum(len(group) for group in groups)
    if declared_count > MAX_ASSETS:
        raise AssetError(f"{origin} static assets: at most {MAX_ASSETS} may be declared, got {declared_count}")
    resolved: dict[str, Asset] = {}
    for group in groups:
        for name, spec in group.items():
            asset = parse_asset(name, spec, base, base_label=base_label, origin=origin)
            resolved.pop(asset.name, None)  # a later group wins, and takes the later place
            resolved[asset.name] = asset
    check_together(resolved.values())
    return resolved


def merge(*groups: Mapping[str, Asset]) -> tuple[Asset, ...]:
    """Lowest priority first (executor, task, submission): a later group wins by name."""
    merged: dict[str, Asset] = {}
    for group in groups:
        for name, asset in group.items():
            merged.pop(name, None)
            merged[name] = asset
    return check_together(merged.values())


def load_config_file(path: Path, root: Path | None) -> tuple[Asset, ...]:
    """The executor group from the YAML file ``STATIC_ASSETS_CONFIG`` (paths relative to ``root``)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise AssetError(f"cannot read {path}: {exc.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise AssetError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        declared = yaml.safe_load(raw)
    except yaml.MarkedYAMLError as exc:
        where = f"line {exc.problem_mark.line + 1}: " if exc.problem_mark else ""
        raise AssetError(f"{path} is not valid YAML ({where}{exc.problem})") from None
    except yaml.YAMLError as exc:
        raise AssetError(f"{path} is not valid YAML ({' '.join(str(exc).split())})") from None
    if declared is None:
        raise AssetError(f"{path} is empty; write {{}} for no assets")
    return tuple(resolve(declared, root, base_label="STATIC_ASSETS_ROOT", origin="executor").values())


def _kind(value: object) -> str:
    if (
        isinstance(value, Mapping)
        and value
        and not any(key in value for key in ASSET_KEYS)
        and all(isinstance(item, Mapping) for item in value.values())
    ):
        return "group"
    return "asset"


def _mixed(origin: str, asset: str, group: str) -> AssetError:
    return AssetError(
        f"{origin} static assets mix assets and named groups: {asset!r} is an asset, {group!r} is a group; "
        f"use one shape"
    )


def _grouped(declared: Mapping, origin: str) -> list[Mapping]:
    ordering = declared[ORDERING]
    if not isinstance(ordering, list) or not all(isinstance(item, str) for item in ordering):
        raise AssetError(f"{origin} static assets: '{ORDERING}' must be a list of group names")
    entries = {name: value for name, value in declared.items() if name != ORDERING}
    groups = [name for name, value in entries.items() if _kind(value) == "group" or value == {}]
    assets = [name for name in entries if name not in groups]
    if assets and groups:
        raise _mixed(origin, assets[0], groups[0])
    if not groups:
        raise AssetError(
            f"{origin} static assets: '{ORDERING}' is given but there are no named groups"
            + (f" ({assets[0]!r} is an asset)" if assets else "")
        )
    seen: set[str] = set()
    for name in ordering:
        if name not in entries:
            raise AssetError(f"{origin} static assets: '{ORDERING}' names {name!r}, which is not a group")
        if name in seen:
            raise AssetError(f"{origin} static assets: '{ORDERING}' names {name!r} twice")
        seen.add(name)
    left_out = [name for name in groups if name not in seen]
    if left_out:
        raise AssetError(f"{origin} static assets: group {left_out[0]!r} is not in '{ORDERING}'")
    return [entries[name] for name in ordering]
