"""Static assets (SPEC section 6): files and folders a task reaches without shipping them.

Plain Python, no Django: the pipeline, the API and the configuration call it;
it knows nothing of them.

- ``model``: one asset, its rules, ``AssetError``;
- ``groups``: flat and grouped declarations, the executor < task < submission merge,
  the ``STATIC_ASSETS_CONFIG`` file;
- ``placeholders``: ``{{static:NAME}}``;
- ``materialise``: copying an asset into a folder without following links;
- ``view``: what one evaluation's commands see (paths, binds, variables).
"""

from assets.groups import load_config_file, merge, resolve
from assets.materialise import copy_asset, tree_bytes
from assets.model import Asset, AssetError, env_name
from assets.placeholders import PlaceholderError, substitute
from assets.view import MOUNT_ROOT, AssetView, stage

__all__ = [
    "MOUNT_ROOT",
    "Asset",
    "AssetError",
    "AssetView",
    "PlaceholderError",
    "copy_asset",
    "env_name",
    "load_config_file",
    "merge",
    "resolve",
    "stage",
    "substitute",
    "tree_bytes",
]
