"""`manage.py signing_key list` and `manage.py signing_key rotate`: the keys results are signed with (SPEC §18).

1. ``list``: one line per key, the current first: key_id, created_at, and which is current.
2. ``rotate``: a new current key; earlier public keys stay listed (GET /public-key), so results
   they signed still verify, and the old private key is removed (docs/signatures.md says why).
   Running services pick the new key up at their next signature, without a restart. With
   SIGNING_KEY_FILE set the operator owns the key: rotate refuses and says to replace the file.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from evaluations import signing


class Command(BaseCommand):
    help = "List the keys results are signed with, or rotate to a new one."
    requires_system_checks = []

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        actions.add_parser("list", help="key_id and created_at of every key, the current first")
        actions.add_parser("rotate", help="make a new current key; earlier public keys stay listed")

    def handle(self, *args, action, **options):
        ring = signing.keyring(settings.EXECUTOR)
        try:
            if action == "rotate":
                new = ring.rotate()
                self.stdout.write(f"signing key rotated: {new} is current; earlier public keys stay listed")
                return
            keys = ring.public_keys()
        except signing.SigningKeyError as exc:
            raise CommandError(str(exc)) from None
        for position, key in enumerate(keys):
            self.stdout.write(f"{key.key_id}  {signing.ALG}  {key.created_at}{'  current' if position == 0 else ''}")
