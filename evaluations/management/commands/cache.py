"""`manage.py cache list` and `manage.py cache clear [KEY...]`: this host's workspace cache (SPEC §13).

1. ``list``: one line per snapshot: key, repository, base commit, size,
   files, last used, hits (``--json`` for a machine); then the totals with
   the mirrors (bytes and files: eviction keeps both under their caps).
2. ``clear``: the snapshots named (every one, and the mirrors, without a
   key). One an evaluation is running from is moved aside and removed by
   the next reaper pass once that evaluation ends; an unknown key is an
   error (exit status 1), the others are still cleared.
"""

from __future__ import annotations

import json
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from evaluations.cache.store import Store


class Command(BaseCommand):
    help = "List or clear the workspace cache (install snapshots and repository mirrors) of this host."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        listing = actions.add_parser("list", help="key, repository, base commit, size, files, last used, hits")
        listing.add_argument("--json", action="store_true", help="one JSON document instead of a table")
        clearing = actions.add_parser("clear", help="remove the snapshots named, or everything without a key")
        clearing.add_argument("keys", nargs="*", metavar="KEY")

    def handle(self, *args, action, **options):
        store = Store(settings.EXECUTOR.cache_root)
        if action == "list":
            self._list(store, as_json=options["json"])
        else:
            self._clear(store, options["keys"])

    def _list(self, store: Store, *, as_json: bool) -> None:
        rows = []
        for entry in store.all_entries():
            hits, last_used = entry.hits()
            rows.append(
                {
                    "key": entry.key,
                    "repository": entry.meta.get("repo", ""),
                    "base_commit": entry.meta.get("commit", ""),
                    "size_bytes": entry.size_bytes,
                    "files": entry.files,
                    "last_used": _iso(last_used),
                    "hits": hits,
                }
            )
        total = store.usage()
        if as_json:
            listing = {"entries": rows, "total_bytes": total.bytes, "total_files": total.files}
            self.stdout.write(json.dumps(listing, indent=2))
            return
        self.stdout.write(
            f"{'KEY':32}  {'SIZE':>9}  {'FILES':>9}  {'LAST USED':20}  {'HITS':>5}  BASE COMMIT  REPOSITORY"
        )
        for row in rows:
            files = "?" if row["files"] is None else row["files"]  # built before files were counted
            self.stdout.write(
                f"{row['key']:32}  {human_size(row['size_bytes']):>9}  {files:>9}  {row['last_used']:20}  {row['hits']:>5}  "
                f"{row['base_commit'][:11]:11}  {row['repository']}"
            )
        self.stdout.write(
            f"{len(rows)} snapshots; {human_size(total.bytes)} and {total.files} files with the mirrors, in {store.root}"
        )

    def _clear(self, store: Store, keys: list[str]) -> None:
        if not keys:
            removed = [entry.key for entry in store.all_entries() if store.remove(entry.key)]
            mirrors = store.clear_mirrors()
            self.stdout.write(f"cleared {len(removed)} snapshots and {mirrors} mirrors")
            return
        unknown = [key for key in keys if not store.remove(key)]
        cleared = len(keys) - len(unknown)
        self.stdout.write(f"cleared {cleared} snapshots")
        if unknown:
            raise CommandError(f"no such cache entry: {', '.join(unknown)}")


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def human_size(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)
