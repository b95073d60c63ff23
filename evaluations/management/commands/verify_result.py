"""`manage.py verify_result FILE|- [--public-key PEM_FILE]`: check a saved signed document (SPEC §18).

An evaluation object, a batch object or a callback's body (the same objects). Without
``--public-key`` the key is this service's, found by the signature's key_id among every key it
has signed with. Exit status 0: valid (one line naming the key); 1: not valid (a sentence naming
the key and the signed fields); 2: the file cannot be read or is not a signed document.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from evaluations import signing


class Command(BaseCommand):
    help = "Verify the Ed25519 signature of a saved evaluation or batch document (exit 0 valid, 1 invalid)."
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("file", metavar="FILE", help="the saved JSON document; - for standard input")
        parser.add_argument(
            "--public-key", metavar="PEM_FILE", help="verify with this public key instead of the service's keyring"
        )

    def handle(self, *args, file, public_key, **options):
        document = _read_document(file)
        try:
            signature = signing.signature_of(document)
        except signing.NotSigned as exc:
            raise CommandError(f"{file}: not a signed document: {exc}", returncode=2) from None
        key_id = signature["key_id"]
        key = _given_key(public_key) if public_key else _service_key(key_id)
        if public_key and signing.key_id(key) != key_id:
            raise CommandError(
                f"invalid: {file} was signed with key {key_id}, and {public_key} is key {signing.key_id(key)}",
                returncode=1,
            )
        verdict = signing.verify(document, key)
        fields = ", ".join(verdict.fields)
        if not verdict.valid:
            raise CommandError(
                f"invalid: the signature by key {key_id} does not match the document: one of the signed fields "
                f"({fields}) was changed or removed, or the signature itself",
                returncode=1,
            )
        self.stdout.write(f"valid: signed by key {key_id} ({signing.ALG}) over {len(verdict.fields)} fields: {fields}")


def _read_document(file: str):
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"{file}: cannot be read: {exc}", returncode=2) from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CommandError(f"{file}: not JSON: {exc}", returncode=2) from None


def _given_key(path: str):
    try:
        return signing.load_public_key(Path(path).read_bytes())
    except OSError as exc:
        raise CommandError(f"--public-key {path}: cannot be read: {exc}", returncode=2) from None
    except ValueError as exc:
        raise CommandError(f"--public-key {path}: {exc}", returncode=2) from None


def _service_key(key_id: str):
    found = signing.keyring(settings.EXECUTOR).find(key_id)
    if found is None:
        raise CommandError(
            f"invalid: signed with key {key_id}, which is not one of this service's keys "
            "(GET /public-key lists them; pass --public-key for another service's)",
            returncode=1,
        )
    return found.verifier()
