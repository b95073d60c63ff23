"""How the commands of one evaluation see its assets (SPEC section 6).

Under a sandbox that binds paths (``isolated``), every asset is bound
read-only at ``/static/<save_path>``, and that is its placeholder value and
its ``STATIC_ASSET_<NAME>``; ``STATIC_ASSETS_DIR`` is ``/static``.

Without one, commands read the host: an executor or submission asset at its
source under ``STATIC_ASSETS_ROOT`` (which the sandbox uid must be able to
read), a task asset at a copy in the session's staging folder
(``<session>/static``), because the task folder itself is root-only (it
holds the hidden tests). The staging folder also gets a link to each
asset's source at its ``save_path``, so ``$STATIC_ASSETS_DIR/<save_path>``
works in both modes. Staged copies are root-owned: readable, not writable,
by the commands, like the read-only binds. Under the sandbox the staged
copy of a task asset is what is bound, for the same reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from assets import placeholders
from assets.materialise import copy_asset, link_asset
from assets.model import Asset

MOUNT_ROOT = "/static"
STAGED_ORIGINS = ("task",)  # sources the commands' uid cannot read where they are


@dataclass(frozen=True)
class AssetView:
    assets: tuple[Asset, ...] = ()
    isolated: bool = False
    staging: Path | None = None  # <session>/static
    host_paths: Mapping[str, Path] = field(default_factory=dict)  # where each asset's files are on the host

    @property
    def directory(self) -> str:
        """``STATIC_ASSETS_DIR``."""
        return MOUNT_ROOT if self.isolated or self.staging is None else str(self.staging)

    @property
    def save_paths(self) -> list[str]:
        return [asset.save_path for asset in self.assets]

    def host_path(self, asset: Asset) -> Path:
        return self.host_paths.get(asset.name, asset.source)

    def path(self, asset: Asset) -> str:
        """The asset's path as a command sees it: its placeholder value."""
        return f"{MOUNT_ROOT}/{asset.save_path}" if self.isolated else str(self.host_path(asset))

    def paths(self) -> dict[str, str]:
        return {asset.name: self.path(asset) for asset in self.assets}

    def substitute(self, text: str) -> str:
        """``text`` with its placeholders replaced; PlaceholderError names an unknown one."""
        return placeholders.substitute(text, self.paths())

    def env(self) -> dict[str, str]:
        """``STATIC_ASSETS_DIR`` and one ``STATIC_ASSET_<NAME>`` per asset."""
        return {"STATIC_ASSETS_DIR": self.directory, **{asset.env_name: self.path(asset) for asset in self.assets}}

    def binds(self) -> list[tuple[Path, str]]:
        """(host source, path inside the sandbox) for each read-only bind; none without the sandbox."""
        if not self.isolated:
            return []
        return [(self.host_path(asset), f"{MOUNT_ROOT}/{asset.save_path}") for asset in self.assets]


def stage(assets: Iterable[Asset], staging: Path, *, isolated: bool, max_bytes: int | None = None) -> AssetView:
    """Fill ``staging`` (created, mode 0755) and return the view the commands get."""
    assets = tuple(assets)
    staging.mkdir(mode=0o755, exist_ok=True)
    staging.chmod(0o755)
    host_paths: dict[str, Path] = {}
    spent = 0
    for asset in assets:
        if asset.origin in STAGED_ORIGINS:
            budget = None if max_bytes is None else max_bytes - spent
            spent += copy_asset(asset, staging, owner=None, max_bytes=budget)
            host_paths[asset.name] = staging / asset.save_path
        else:
            link_asset(asset, staging, asset.source)
            host_paths[asset.name] = asset.source
    return AssetView(assets=assets, isolated=isolated, staging=staging, host_paths=host_paths)
