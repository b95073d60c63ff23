"""Image references as Docker reads them: ``[host[:port]/]path[:tag][@sha256:<hex>]``.

The grammar is distribution's ``reference`` package (``reference/regexp.go``): path components
are lower case ``[a-z0-9]`` runs joined by ``.``, ``_``, ``__`` or dashes; the first component is a
registry host when it has a ``.`` or a ``:`` or is ``localhost``; a one-part name on Docker Hub
lives under ``library/``.

``rewrite`` is the one place IMAGE_REWRITES (SPEC §22) applies: every pull goes through it, so an
image task's reference and a Dockerfile's ``FROM`` (and ``COPY --from`` an image) are replaced alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from evaluations.images.errors import ImageError

DOCKER_HUB = "docker.io"
_HUB_ALIASES = {"docker.io", "index.docker.io", "registry-1.docker.io"}
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_HOST = re.compile(
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    r"|\[[0-9a-fA-F:.]+\])(?::[0-9]{1,5})?"
)
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MAX_NAME_CHARS = 255


@dataclass(frozen=True)
class Reference:
    registry: str  # host[:port], as written (docker.io for Docker Hub)
    repository: str  # path, e.g. library/python
    tag: str | None  # None only when a digest is given without a tag
    digest: str | None  # sha256:<hex>

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    @property
    def name(self) -> str:
        """registry/repository, without tag or digest."""
        return f"{self.registry}/{self.repository}"

    def with_digest(self, digest: str) -> Reference:
        return Reference(self.registry, self.repository, None, digest)


def parse(text: str, default_registry: str = DOCKER_HUB) -> Reference:
    """``text`` as a canonical Reference; ImageError with one sentence if it is malformed."""
    if not isinstance(text, str) or not text.strip():
        raise ImageError("The image reference is empty.")
    if text != text.strip() or any(c.isspace() or ord(c) < 0x20 for c in text):
        raise ImageError(f"The image reference {text!r} contains whitespace or control characters.")
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.fullmatch(digest):
            raise ImageError(f"The image reference {text!r} has a digest that is not sha256:<64 lower-case hex>.")
    name, tag = rest, None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = rest.rsplit(":", 1)
        if not _TAG.fullmatch(tag):
            raise ImageError(
                f"The image reference {text!r} has an invalid tag {tag!r} (1 to 128 of A-Z a-z 0-9 _ . -, not first . or -)."
            )
    if not name:
        raise ImageError(f"The image reference {text!r} has no repository name.")
    parts = name.split("/")
    first = parts[0]
    if len(parts) > 1 and ("." in first or ":" in first or first == "localhost"):
        if not _HOST.fullmatch(first):
            raise ImageError(f"The image reference {text!r} has an invalid registry host {first!r}.")
        registry, path = first, parts[1:]
    else:
        registry, path = default_registry, parts
    for component in path:
        if not _COMPONENT.fullmatch(component):
            if component.lower() != component and _COMPONENT.fullmatch(component.lower()):
                raise ImageError(f"The image reference {text!r} must be lower case in its repository name.")
            raise ImageError(
                f"The image reference {text!r} has an invalid path component {component!r} "
                "(lower-case letters and digits, joined by '.', '_', '__' or '-')."
            )
    if registry.lower() in _HUB_ALIASES:
        registry = DOCKER_HUB
        if len(path) == 1:
            path = ["library", *path]
    repository = "/".join(path)
    if len(repository) > MAX_NAME_CHARS:
        raise ImageError(f"The image reference {text!r} has a repository name over {MAX_NAME_CHARS} characters.")
    if tag is None and digest is None:
        tag = "latest"
    return Reference(registry, repository, tag, digest)


@dataclass(frozen=True)
class Rewrite:
    """IMAGE_REWRITES' answer for one reference: ``ref`` is what is pulled; ``rewritten_from`` the
    reference as the task wrote it (None when no entry matched)."""

    ref: Reference
    rewritten_from: str | None


def same(a: Reference, b: Reference) -> bool:
    """One image reference, whatever case its registry host was written in."""
    return (a.registry.lower(), a.repository, a.tag, a.digest) == (b.registry.lower(), b.repository, b.tag, b.digest)


def rewrite(text: str, rewrites: tuple[tuple[str, str], ...], default_registry: str = DOCKER_HUB) -> Rewrite:
    """``text`` parsed, then replaced by the first IMAGE_REWRITES entry whose left side is the same
    reference: both sides are read as references (``python:3.12`` is
    ``docker.io/library/python:3.12``, a missing tag ``latest``); the match is exact, tag and digest
    included, and applied once (a target is never rewritten again). ImageError for a malformed side
    (settings_loader refuses those at start)."""
    ref = parse(text, default_registry)
    for source, target in rewrites:
        if same(parse(source, default_registry), ref):
            return Rewrite(parse(target, default_registry), text)
    return Rewrite(ref, None)
