"""Tell the event streams that an evaluation or a batch changed: best effort, after the commit.

1. The writers call ``announce`` inside their transaction; the datagrams go out when it
   commits (``transaction.on_commit``), so a woken stream finds the rows. A rolled back
   change announces nothing.
2. On this host: one datagram with the ids to each hub socket in DATA_DIR/events/ (one per
   web process that has served a stream). Across hosts on PostgreSQL: ``pg_notify``.
3. Nothing waits and nothing fails: a full queue or a dead hub's socket is skipped (a
   dead one's is removed), and a stream re-reads the rows once per keep-alive tick anyway.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, connection, transaction

from evaluations.events import datagrams

CHANNEL = "term_executor_events"
SOCKET_SUFFIX = ".sock"


def hub_dir(data_dir: Path) -> Path:
    return data_dir / "events"


def announce(*ids) -> None:
    """After the current transaction commits (at once outside one): the streams of these
    evaluation or batch ids re-read them."""
    payload = " ".join(str(i) for i in ids if i is not None)
    if payload:
        transaction.on_commit(lambda: send(settings.EXECUTOR.data_dir, payload))


def send(data_dir: Path, payload: str) -> None:
    if connection.vendor == "postgresql":
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload])
        except DatabaseError:
            pass  # best effort: the hubs on this host get the datagram below
    datagrams.send_to_each(hub_dir(data_dir), payload.encode(), suffix=SOCKET_SUFFIX, remove_refused=True)
