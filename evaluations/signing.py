"""Ed25519 signatures over ended evaluation and batch objects (SPEC §18, docs/signatures.md).

1. What is signed: the RFC 8785 canonical JSON (``rfc8785``) of the object with only the
   fields its ``signature.fields`` lists, so a platform checks a saved document with
   ``cryptography`` and ``rfc8785`` alone, and a field added to the object later changes nothing.
2. The keyring is a folder, DATA_DIR/signing: ``current.pem`` (the private key, PKCS#8 PEM,
   0600) and ``public/<key_id>.json`` for every key the service ever signed with (the
   operator's SIGNING_KEY_FILE too), so results signed before a rotation still verify.
   One file per public key: nothing is read, changed and written back by two processes.
3. The key is made at first start, or by the first signature, race-safely: a complete temp
   file is linked to ``current.pem`` (``link`` fails if it exists), so two processes
   starting at once end with the one key that got there first.
4. ``rotate`` renames a new key over ``current.pem``; every process notices by a stat per
   signature (inode and mtime), without a restart. The old private key is gone with it: no
   new document can be signed with a key that is no longer current, and one copy of a
   private key fewer is one fewer to leak; its public half stays listed.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

logger = logging.getLogger("term_executor.signing")

ALG = "ed25519"

# The fields of an evaluation object (representation.evaluation_document) a signature covers:
# what makes the result, and what the result says about how it was made (SPEC §21: the agent's
# changes outside its folder, the limits it ran under, the files it left, whose it is).
EVALUATION_FIELDS = (
    "eval_id", "task_url", "task_sha256", "agent_sha256", "environment", "status", "passed", "reward",
    "rewards", "error_kind", "test_results", "agent_patch_sha256", "created_at", "started_at", "finished_at",
    "executor_version", "batch_id", "attempt", "system_changes", "limits_applied", "artifacts", "owner",
    "steps",
)  # fmt: skip
# ... and of a batch object (representation.batch_document).
BATCH_FIELDS = (
    "batch_id", "status", "reward", "mean_reward", "pass_at_k", "agent_sha256", "tasks", "evaluations",
    "created_at", "finished_at", "executor_version",
)  # fmt: skip


class SigningKeyError(Exception):
    """The signing key cannot be had; the message names what to fix (start-up stops on it)."""


class NotSigned(Exception):
    """A document that is not a signed evaluation or batch object (or not JSON at all)."""


def key_id(public_key: Ed25519PublicKey) -> str:
    """The first 16 hex digits of the sha256 of the raw 32-byte public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_pem(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def canonical(document: dict, fields) -> bytes:
    """The bytes a signature is over: RFC 8785 JSON of ``document``'s ``fields`` (each must be there)."""
    missing = [name for name in fields if name not in document]
    if missing:
        raise NotSigned(f"the signed field(s) {', '.join(missing)} are missing from the document")
    return rfc8785.dumps({name: document[name] for name in fields})


# -- the keyring ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublicKey:
    key_id: str
    public_key_pem: str
    created_at: str

    def as_json(self) -> dict:
        return {"key_id": self.key_id, "alg": ALG, "public_key_pem": self.public_key_pem, "created_at": self.created_at}

    def verifier(self) -> Ed25519PublicKey:
        return serialization.load_pem_public_key(self.public_key_pem.encode())


class Keyring:
    """The service's signing keys: the current private key and every public key it has used."""

    def __init__(self, folder: Path, key_file: Path | None = None):
        self.folder = folder
        self.key_file = key_file  # SIGNING_KEY_FILE: the operator's key, used as it is
        self._lock = threading.Lock()
        self._loaded: tuple[tuple[int, int, int], Ed25519PrivateKey, str] | None = None

    @property
    def private_path(self) -> Path:
        return self.key_file or self.folder / "current.pem"

    @property
    def public_folder(self) -> Path:
        return self.folder / "public"

    def current(self) -> tuple[Ed25519PrivateKey, str]:
        """The current private key and its key_id: made here if there is none; read again when the
        file changed (a rotation by another process). SigningKeyError when it cannot be had."""
        with self._lock:
            try:
                st = os.stat(self.private_path)
            except FileNotFoundError:
                if self.key_file is not None:
                    raise SigningKeyError(f"SIGNING_KEY_FILE: {self.key_file}: does not exist") from None
                try:
                    self._make_first()
                    st = os.stat(self.private_path)
                except OSError as exc:
                    raise SigningKeyError(f"cannot make a signing key in {self.folder}: {exc}") from None
            except OSError as exc:
                raise SigningKeyError(self._unreadable(exc)) from None
            stamp = (st.st_dev, st.st_ino, st.st_mtime_ns)
            if self._loaded is None or self._loaded[0] != stamp:
                private = self._read_private()
                kid = key_id(private.public_key())
                self._record_public(private.public_key(), st.st_mtime)
                self._loaded = (stamp, private, kid)
            return self._loaded[1], self._loaded[2]

    def public_keys(self) -> list[PublicKey]:
        """Every public key the service has signed with: the current first, then newest first."""
        _private, current = self.current()
        found = self._recorded()
        found.sort(key=lambda k: k.created_at, reverse=True)  # ISO times of one format sort as times
        found.sort(key=lambda k: k.key_id != current)  # stable: the current first, then newest first
        return found

    def find(self, wanted: str) -> PublicKey | None:
        """The recorded public key ``wanted`` (no key is made for a look-up: verify_result reads only)."""
        return next((k for k in self._recorded() if k.key_id == wanted), None)

    def _recorded(self) -> list[PublicKey]:
        found = []
        for path in self.public_folder.glob("*.json"):
            try:
                record = json.loads(path.read_text())
                found.append(PublicKey(record["key_id"], record["public_key_pem"], record["created_at"]))
            except (OSError, ValueError, KeyError):
                continue  # not one of ours: records are linked into place whole (_record_public)
        return found

    def rotate(self) -> str:
        """Make a new current key; the old one's public half stays listed. Returns the new key_id."""
        if self.key_file is not None:
            raise SigningKeyError(
                f"SIGNING_KEY_FILE is set ({self.key_file}): rotate by replacing that file with a new "
                "Ed25519 key; the public half of every key the service has signed with stays listed"
            )
        self.current()  # the old key's public half is recorded before it is replaced
        private = Ed25519PrivateKey.generate()
        self._record_public(private.public_key(), None)
        temp = self._write_temp(_private_pem(private))
        os.replace(temp, self.private_path)
        return key_id(private.public_key())

    # -- files --

    def _make_first(self) -> None:
        """A first key, unless another process linked one first (then that one is kept)."""
        self._place(_private_pem(Ed25519PrivateKey.generate()), self.private_path)

    def _read_private(self) -> Ed25519PrivateKey:
        try:
            data = self.private_path.read_bytes()
        except OSError as exc:
            raise SigningKeyError(self._unreadable(exc)) from None
        try:
            private = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise SigningKeyError(f"{self._label}: not an unencrypted PEM private key ({exc})") from None
        except Exception as exc:  # the backend's own errors for odd key types
            raise SigningKeyError(f"{self._label}: cannot be read as a PEM private key ({exc})") from None
        if not isinstance(private, Ed25519PrivateKey):
            raise SigningKeyError(f"{self._label}: is a {type(private).__name__}, not an Ed25519 private key")
        return private

    def _record_public(self, public: Ed25519PublicKey, made_at: float | None) -> None:
        kid = key_id(public)
        path = self.public_folder / f"{kid}.json"
        if path.exists():
            return
        when = (
            datetime.datetime.fromtimestamp(made_at, datetime.UTC) if made_at else datetime.datetime.now(datetime.UTC)
        )
        record = {"key_id": kid, "alg": ALG, "public_key_pem": public_pem(public), "created_at": _iso(when)}
        self.public_folder.mkdir(parents=True, exist_ok=True)
        self._place(json.dumps(record, indent=1).encode(), path, mode=0o644)

    def _place(self, data: bytes, path: Path, mode: int = 0o600) -> None:
        """``data`` as ``path``, whole, unless another process placed one first (then theirs is kept):
        a complete temp file is linked, and ``link`` fails if the name exists."""
        temp = self._write_temp(data, mode)
        try:
            os.link(temp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(temp)

    def _write_temp(self, data: bytes, mode: int = 0o600) -> Path:
        """A complete file beside the keyring's, written and synced, to link or rename into place."""
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        temp = self.folder / f".tmp-{os.getpid()}-{threading.get_ident()}-{os.urandom(4).hex()}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.fchmod(fd, mode)  # whatever the umask
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return temp

    @property
    def _label(self) -> str:
        return f"SIGNING_KEY_FILE: {self.key_file}" if self.key_file else f"signing key {self.private_path}"

    def _unreadable(self, exc: OSError) -> str:
        return f"{self._label}: cannot be read ({exc.strerror or exc})"


def _private_pem(private: Ed25519PrivateKey) -> bytes:
    return private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _iso(when: datetime.datetime) -> str:
    return when.isoformat(timespec="microseconds").replace("+00:00", "Z")


_keyrings: dict[tuple, Keyring] = {}
_keyrings_lock = threading.Lock()


def keyring(config) -> Keyring:
    """The keyring of ``config`` (DATA_DIR and SIGNING_KEY_FILE), one per process: its key is
    read once and again only when its file changed."""
    where = (config.data_dir / "signing", config.signing_key_file)
    with _keyrings_lock:
        found = _keyrings.get(where)
        if found is None:
            found = _keyrings[where] = Keyring(*where)
        return found


def default_keyring() -> Keyring:
    from django.conf import settings

    return keyring(settings.EXECUTOR)


# -- signing and verifying --------------------------------------------------------------------


def sign(document: dict, fields, ring: Keyring | None = None) -> dict:
    """The ``signature`` object of ``document`` (an ended evaluation or batch object)."""
    private, kid = (ring or default_keyring()).current()
    value = private.sign(canonical(document, fields))
    return {"key_id": kid, "alg": ALG, "value": base64.b64encode(value).decode(), "fields": list(fields)}


def sign_if_possible(document: dict, fields) -> dict | None:
    """``sign``, or None (logged) when the key cannot be had: an evaluation still ends, unsigned, and
    is signed when next read once the key is back (start-up refuses a bad key: this is a key file
    removed or broken while the service runs)."""
    try:
        return sign(document, fields)
    except SigningKeyError as exc:
        logger.error("result left unsigned: %s", exc)
        return None


@dataclass(frozen=True)
class Verdict:
    valid: bool
    key_id: str
    fields: tuple[str, ...]


def load_public_key(pem: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM; ValueError saying why not."""
    try:
        key = serialization.load_pem_public_key(pem)
    except Exception as exc:  # the backend raises several kinds for bad input
        raise ValueError(f"not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"a {type(key).__name__}, not an Ed25519 public key")
    return key


def signature_of(document) -> dict:
    """The document's signature object; NotSigned when it has none or it is malformed."""
    if not isinstance(document, dict):
        raise NotSigned("not a JSON object")
    signature = document.get("signature")
    if signature is None:
        raise NotSigned("the document has no signature (signature is null: it had not ended)")
    if not isinstance(signature, dict) or signature.get("alg") != ALG:
        raise NotSigned(f"signature is not an {ALG} signature object")
    fields, value, kid = signature.get("fields"), signature.get("value"), signature.get("key_id")
    if not (isinstance(fields, list) and fields and all(isinstance(f, str) for f in fields)):
        raise NotSigned("signature.fields is not a list of field names")
    if not (isinstance(value, str) and isinstance(kid, str)):
        raise NotSigned("signature.value and signature.key_id must be strings")
    return signature


def verify(document: dict, public_key: Ed25519PublicKey) -> Verdict:
    """Whether ``document``'s signature is valid under ``public_key``; NotSigned for no signature.
    A signed field removed from the document makes it invalid, as a changed one does."""
    signature = signature_of(document)
    fields = tuple(signature["fields"])
    try:
        value = base64.b64decode(signature["value"], validate=True)
        public_key.verify(value, canonical(document, fields))
        valid = True
    except (InvalidSignature, NotSigned, ValueError):  # ValueError: bad base64, a number JSON cannot hold
        valid = False
    return Verdict(valid, signature["key_id"], fields)
