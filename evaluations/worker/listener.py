"""The worker's PostgreSQL wake-up: LISTEN for the NOTIFY the API sends when it writes a row.

On SQLite the API reaches the worker through its wake socket alone (worker/wakeup.py).
"""

from __future__ import annotations

from django.db import connection

from evaluations.worker import wakeup


class PostgresListener:
    """LISTEN for the API's NOTIFY on its own autocommit connection."""

    def __init__(self):
        import psycopg

        params = connection.get_connection_params()
        self.conn = psycopg.connect(**params, autocommit=True)
        self.conn.execute(f"LISTEN {wakeup.CHANNEL}")

    def fileno(self) -> int:
        return self.conn.fileno()

    def drain(self) -> None:
        for _ in self.conn.notifies(timeout=0):
            pass

    def close(self) -> None:
        self.conn.close()
