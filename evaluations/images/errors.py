"""The two ways preparing an image fails (SPEC §16): the task's fault, or the host's."""

from __future__ import annotations


class ImageError(Exception):
    """The task's fault: a bad reference, an unknown image or tag, no manifest for this platform, a
    hostile layer, a Dockerfile error, a failing RUN. The message is one sentence naming the thing."""

    kind = "task_invalid"


class ImageUnavailable(ImageError):
    """Neither's fault: the registry unreachable, HTTP 5xx, a timeout, the host's disk full."""

    kind = "infrastructure"
