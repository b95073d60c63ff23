"""Several hosts on one database (SPEC §24): a sandbox lives on the host that made it.

Each service is a ``node``: its PUBLIC_URL when set (what other hosts redirect to), else its host
name and DATA_DIR (two services on one machine are two nodes). POST /sandboxes writes the node
that received it; only that node's worker claims the sandbox, and only its API can reach the
sandbox's process. Another node answers a request for it with 307 to the owner's PUBLIC_URL and
the same path, which clients follow, re-sending the body.
"""

from __future__ import annotations

import socket
from urllib.parse import urljoin


def node(config) -> str:
    return config.public_url or f"{socket.gethostname()}:{config.data_dir}"


def redirect_url(public_url: str, path_and_query: str) -> str:
    """The owner's URL for this request: its PUBLIC_URL (which may carry a path prefix) and the same path."""
    base = public_url if public_url.endswith("/") else public_url + "/"
    return urljoin(base, path_and_query.lstrip("/"))
