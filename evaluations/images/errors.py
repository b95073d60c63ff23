"""The two ways an image step fails, as the evaluation's error kinds (SPEC §16).

A message is one human sentence naming the thing at fault (the reference, the layer digest, the
member path), so it can be shown to the task's author as it is.
"""

from __future__ import annotations


class ImageError(Exception):
    """The task's image is wrong: a bad reference, an unknown image or tag, no manifest for this
    platform, a hostile layer, a Dockerfile error, a failing RUN. Another try gives the same answer."""

    kind = "task_invalid"


class ImageUnavailable(ImageError):
    """Ours or the registry's fault: unreachable, HTTP 5xx, a timeout, our disk full, or the registry
    refusing credentials the operator gave. Another try may succeed."""

    kind = "infrastructure"
