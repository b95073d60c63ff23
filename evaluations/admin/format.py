"""How the admin writes values: times, yes/no, short ids, task names, clipped text.

Pure functions of values (no queries), so the pages stay cheap and the rules
are tested once. Every clipped text says how much it left out.
"""

from __future__ import annotations

import json
from datetime import datetime
from urllib.parse import unquote, urlsplit

from django.utils import timezone
from django.utils.html import format_html

KIB = 1024
# What the detail page ships inline, at most: the log's tail and the head or tail of each other
# output. The whole of each is one click away, as text/plain. The sum stays under 128 KiB.
LOG_TAIL_BYTES = 64 * KIB
TEST_OUTPUTS_BYTES = 24 * KIB  # shared by every test of the evaluation
TEST_OUTPUT_MIN_BYTES = 256  # so each test shows its last lines however many there are
AGENT_OUTPUT_BYTES = 8 * KIB
PATCH_BYTES = 12 * KIB
PROMPT_BYTES = 4 * KIB
ORIGINAL_PR_BYTES = 4 * KIB
TASK_METADATA_BYTES = 2 * KIB
SYSTEM_PATHS_BYTES = 5 * KIB  # what the agent changed outside its folder
SUSPICIOUS_PATHS_BYTES = 2 * KIB  # of those, what the verifier may run
# Rows of a detail table (rewards, artifacts) before "and N more": their values come from the task or the agent.
TABLE_ROWS = 50
# A wrapped line reads as one cell at 1024 px; the whole sentence is in the title and on the detail page.
ERROR_CHARS = 90
TASK_CHARS = 36
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
GENERIC_NAMES = {"task", "archive", "download", "index", "latest", "file"}


def when(value: datetime | None, *, zone: bool = True) -> str:
    """To the second, with the time zone (a list names it once, in its header): 2026-11-22 04:12:33 UTC."""
    if value is None:
        return "-"
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z" if zone else "%Y-%m-%d %H:%M:%S")


def yes_no(value: bool | None, *, unknown: str = "-") -> str:
    """A neutral answer: a red cross reads as an error, and "not timed out" is none."""
    if value is None:
        return unknown
    return "yes" if value else "no"


def figure(value: float | None) -> str:
    """A reward or a share to three places; "-" while there is none (null until a batch ended)."""
    return "-" if value is None else f"{value:.3f}"


def json_text(value) -> str:
    """A JSON column as an operator reads it, indented; "" for null or empty (shown as "none")."""
    return json.dumps(value, indent=2, ensure_ascii=False) if value else ""


def seconds(ms: int | None) -> str:
    if ms is None:
        return "-"
    secs = ms / 1000
    if secs < 10:
        return f"{secs:.2f} s"
    if secs < 60:
        return f"{secs:.1f} s"
    minutes, rest = divmod(int(secs), 60)
    return f"{minutes} min {rest:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def short_id(value) -> str:
    return str(value)[:8]


def owner(name: str | None) -> str:
    """The tenant whose token created a row; "-" for an operator's token, no auth or the CLI."""
    return name or "-"


def task_label(url: str) -> str:
    """What tells tasks apart in a list: the archive's file name, with its folder when the name is generic.

    The host alone does not (every task of a platform comes from one host).
    """
    parts = urlsplit(url)
    segments = [unquote(s) for s in parts.path.split("/") if s]
    if not segments:
        return truncate(parts.hostname or url, TASK_CHARS)
    name = segments[-1]
    stem = name
    for suffix in ARCHIVE_SUFFIXES:
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    if stem.lower() in GENERIC_NAMES and len(segments) > 1:
        stem = f"{segments[-2]}/{stem}"
    return truncate(stem, TASK_CHARS, middle=True)


def truncate(text: str, limit: int, *, middle: bool = False) -> str:
    """At most ``limit`` characters; cut in the middle (names: both ends tell) or at the end (sentences)."""
    if len(text) <= limit:
        return text
    if middle:
        half = (limit - 1) // 2
        return text[:half] + "…" + text[-(limit - 1 - half) :]
    return text[: limit - 1].rstrip() + "…"


def clip(text: str, max_bytes: int, *, keep: str = "tail") -> tuple[str, int, int]:
    """The first or last ``max_bytes`` of ``text`` (UTF-8), how many bytes were left out, and the total."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return text, 0, len(data)
    kept = data[:max_bytes] if keep == "head" else data[-max_bytes:]
    return kept.decode("utf-8", errors="ignore"), len(data) - max_bytes, len(data)


def size(n: int) -> str:
    if n < KIB:
        return f"{n} bytes"
    if n < KIB * KIB:
        return f"{n / KIB:.0f} KiB"
    return f"{n / KIB / KIB:.1f} MiB"


def preformatted(text: str, *, css_class: str = "te-pre", element_id: str = ""):
    id_attr = format_html(' id="{}"', element_id) if element_id else ""
    return format_html('<pre class="{}"{}>{}</pre>', css_class, id_attr, text)


def clipped_pre(text: str, max_bytes: int, *, keep: str, whole_url: str | None, empty: str = "none"):
    """A <pre> of at most ``max_bytes`` of ``text``, saying what was left out and where the whole is."""
    if not text:
        return format_html('<span class="te-none">{}</span>', empty)
    shown, omitted, total = clip(text, max_bytes, keep=keep)
    pre = preformatted(shown, css_class="te-pre te-tail" if keep == "tail" else "te-pre")
    if not omitted:
        return pre
    note = format_html(
        '<p class="te-note">{} {} of {} shown; the {} {} are left out. <a href="{}">Open the whole text</a></p>',
        "The last" if keep == "tail" else "The first",
        size(total - omitted),
        size(total),
        "first" if keep == "tail" else "last",
        size(omitted),
        whole_url,
    )
    return format_html("{}{}", note, pre)
