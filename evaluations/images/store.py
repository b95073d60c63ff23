"""The image store: IMAGES_DIR, shared by every process of the executor on this host.

Layout (all below ``root``)::

    blobs/sha256/<hex>          manifests, configs, compressed layers as pulled (kept for export)
    layers/<hex>/tree/          one unpacked layer (diff_id sha256:<hex>), overlayfs format
    layers/<hex>/meta.json      {"id", "size_bytes", "files", "created_at"}
    images/<hex>.json           an ImageRecord, by its manifest digest
    tags/<sha256 of ref>.json   {"ref", "digest", "resolved_at"}: a reference resolved once
    pins/<hex>/<holder>         flock'd while an evaluation or a build uses the image
    builds/<id>/, builds/<id>.lock   a build's steps (images/build.py), its lock held while it runs
    counters.json               pulls, builds, cache hits (for /metrics)
    locks/                      flock files
    tmp/<name>, tmp/<name>.lock what is in the making (layers, blobs, an export's scratch), each with
                                its owner's flock held until it is gone or renamed into place

The store is root's alone: its folders are 0700 (made so, and an existing store's tightened, when
an ImageStore is made on it). Layers hold images' setuid files; only an evaluation's overlay,
mounted nosuid in its sandbox, shows them to anyone else.

``tmp/`` is marked the top of a hierarchy (``chattr +T``, ``_spread``): ext4 then places each tree
made in it in a block group with inodes to spare, instead of near the trees removed just before.

Why it is safe with several processes:

1. A layer or blob appears by ``rename`` of a complete temporary folder or file, so a reader
   sees all of it or nothing; one flock per layer makes one process unpack it while the others
   wait and then reuse it.
2. Pulls and builds hold the store's ``gc`` lock shared from their first new layer to their
   saved record; ``prune``, ``evict`` and ``remove`` hold it exclusively, so they never delete a
   layer a record is about to name.
3. A pin is an flock, so a pin whose holder died (killed worker) is free without a reaper.
4. What a killed pull, import or export left in ``tmp/`` is known by its free lock (scratch.py):
   it counts in ``total_bytes`` until ``remove_dead_tmp`` (the reaper) or ``prune`` removes it; a
   live owner's entry is never touched.

The store keeps itself under IMAGES_MAX_BYTES (``max_bytes``) in one place: when the outermost
``using()`` of a pull, a build or an import ends, with what it saved pinned meanwhile.
It also counts what it served (``count``: pulls, builds, cache hits) in ``counters.json``, for
/metrics: every process of the host that pulls or builds shares this folder, and nothing else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import stat
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from evaluations import safefs
from evaluations.cache import mounts
from evaluations.images import scratch as tmp_entries
from evaluations.images.errors import ImageError, ImageUnavailable

_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_HEX = re.compile(r"[0-9a-f]{64}")
_HOLDER = re.compile(r"[A-Za-z0-9_.-]{1,128}")
COUNTERS = ("pulls", "builds", "cache_hits")
# ioctl(2) FS_IOC_GETFLAGS / FS_IOC_SETFLAGS (_IOR / _IOW 'f' 1 / 2, long) and FS_TOPDIR_FL, <linux/fs.h>
_GETFLAGS = (2 << 30) | (struct.calcsize("l") << 16) | (ord("f") << 8) | 1
_SETFLAGS = (1 << 30) | (struct.calcsize("l") << 16) | (ord("f") << 8) | 2
_TOPDIR_FL = 0x00020000
BUILD_REACH = ".image-builds"  # WORKSPACE_BASE/.image-builds/<id>/: a build's roots and /tmp (images/build.py)

logger = logging.getLogger("term_executor.images")


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def hex_of(digest: str) -> str:
    """The hex part of ``sha256:<hex>``; ValueError for anything else (a path is built from it)."""
    match = _DIGEST.fullmatch(digest or "")
    if not match:
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return match.group(1)


@dataclasses.dataclass
class ImageRecord:
    digest: str  # manifest digest sha256:...; a built image: sha256 of its canonical manifest JSON
    refs: list[str]
    config: dict  # the OCI image config's "config" object (Env, WorkingDir, User, Cmd, ...)
    layers: list[str]  # diff_ids sha256:<hex>, bottom first
    size_bytes: int
    source: str  # "pull" | "build" | "import"
    created_at: str
    last_used_at: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ImageRecord:
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in names})


class ImageStore:
    """IMAGES_DIR. One object per thread (a pull, a build, a request): ``using`` keeps count of its own nesting.
    A pull's layer threads share their pull's: what they call (``add_layer``, ``has_layer``,
    ``layer_meta``, ``new_blob``) keeps no state in the object."""

    def __init__(self, root: Path, max_bytes: int | None = None):
        self.root = Path(root)
        self.max_bytes = max_bytes  # IMAGES_MAX_BYTES; None: no eviction after additions (tests, read-only uses)
        self._using = 0  # how deep in using() this object is
        self._added: list[str] = []  # digests saved under the current using()
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for sub in ("blobs", "blobs/sha256", "layers", "images", "tags", "pins", "locks", "tmp"):
            (self.root / sub).mkdir(mode=0o700, exist_ok=True)
        _root_only(self.root)  # a store made before folders were 0700, or by another umask
        _spread(self.root / "tmp")

    @classmethod
    def of(cls, config) -> ImageStore:
        """The store the settings name: IMAGES_DIR (default DATA_DIR/images), capped at IMAGES_MAX_BYTES."""
        return cls(config.images_root, max_bytes=config.images_max_bytes)

    # -- locks ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _lock(
        self, name: str, *, shared: bool = False, wait: bool = True, waiting: Iterable[None] | None = None
    ) -> Iterator[bool]:
        """Hold the flock ``name``; yields False (not held) when ``wait`` is off and another has it.
        ``waiting``: instead of blocking, try again after each of its steps (a pull's clock, which
        raises when the pull is cancelled or out of time)."""
        fd = os.open(self.root / "locks" / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
            if waiting is not None:
                _flock_polling(fd, mode, waiting)  # held when it returns: ``waiting`` raises to give up
            try:
                if waiting is None:
                    fcntl.flock(fd, mode | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def using(self) -> Iterator[bool]:
        """Held (shared) by a pull, a build or an import while it adds layers and saves its record: no
        prune meanwhile. When the outermost one of this object ends well, the store is brought under
        ``max_bytes``: a build's FROM pulls nest inside the build's, so it evicts once, at its end."""
        with self._lock("gc", shared=True) as held:
            self._using += 1
            try:
                yield held
            finally:
                self._using -= 1
        if self._using == 0 and self._added:
            added, self._added = self._added, []
            self._keep_under_cap(added)

    def _keep_under_cap(self, added: list[str]) -> None:
        """Evict down to ``max_bytes``, never the images just added (pinned meanwhile). Gives up at once
        while another pull or build is adding layers (the next one to end evicts); a failure is logged,
        not raised: the image the caller asked for is there."""
        if self.max_bytes is None:
            return
        with contextlib.ExitStack() as pins:
            for digest in dict.fromkeys(added):
                with contextlib.suppress(ImageError):  # already gone (removed by another process)
                    pins.enter_context(self.pin(digest, f"added-{os.getpid()}-{os.urandom(4).hex()}"))
            try:
                for record in self.evict(self.max_bytes, wait=False):
                    logger.info("image store over IMAGES_MAX_BYTES: evicted %s (%s)", record.digest, record.refs)
            except OSError as exc:
                logger.warning("image store eviction failed: %s", exc)

    # -- layers -----------------------------------------------------------------------------

    def layer_dir(self, layer_id: str) -> Path:
        return self.root / "layers" / hex_of(layer_id)

    def layer_tree(self, layer_id: str) -> Path:
        return self.layer_dir(layer_id) / "tree"

    def has_layer(self, layer_id: str) -> bool:
        return (self.layer_dir(layer_id) / "meta.json").is_file()

    def layer_meta(self, layer_id: str) -> dict:
        return json.loads((self.layer_dir(layer_id) / "meta.json").read_text())

    def add_layer(
        self,
        layer_id: str,
        populate: Callable[[Path], dict | None],
        *,
        waiting: Iterable[None] | None = None,
        origin: dict | None = None,
    ) -> Path:
        """The tree of ``layer_id``, made by ``populate(tmp_tree)`` unless the store has it.

        ``populate`` fills an empty folder inside the store and may return {"files", "size_bytes"}
        (else the tree is measured). The folder is renamed into place once complete; one process
        populates while the others for the same id wait on its flock and then reuse it (``waiting``:
        how a pull waits, see ``_lock``). ``origin``: kept in its meta, where it came from (a pull
        through credentials: images/pull.py asks another repository before reusing it).
        """
        final = self.layer_dir(layer_id)
        with self._lock(f"layer-{hex_of(layer_id)}", waiting=waiting):
            if self.has_layer(layer_id):
                return final / "tree"
            self._make_layer(layer_id, populate, origin)
        return final / "tree"

    def _make_layer(self, layer_id: str, populate: Callable[[Path], dict | None], origin: dict | None) -> None:
        final = self.layer_dir(layer_id)
        with self._tmp_entry(f"layer-{hex_of(layer_id)}") as tmp:
            try:
                (tmp / "tree").mkdir(parents=True)
                os.chmod(tmp / "tree", 0o755)
                counts = populate(tmp / "tree")
                if counts is None:
                    usage = safefs.tree_usage(tmp / "tree")
                    counts = {"files": usage.files, "size_bytes": usage.bytes}
                meta = {
                    "id": layer_id,
                    "size_bytes": int(counts["size_bytes"]),
                    "files": int(counts["files"]),
                    "created_at": now_iso(),
                    **(origin or {}),
                }
                (tmp / "meta.json").write_text(json.dumps(meta))
                if final.exists():  # a half-removed layer (a prune killed midway)
                    safefs.remove_tree_nofollow(final)
                os.rename(tmp, final)
            except OSError as exc:
                raise disk_error(exc, f"storing layer {layer_id}") from None

    # -- blobs ------------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / hex_of(digest)

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def put_blob(self, digest: str, data: bytes) -> None:
        """Keep ``data`` (a manifest or a config) under its digest, which the caller has checked."""
        if self.has_blob(digest):
            return
        with self.new_blob(digest) as out:
            out.write(data)

    @contextlib.contextmanager
    def new_blob(self, digest: str) -> Iterator:
        """A file to write the blob ``digest`` into; it is renamed into place if the block ends
        without an exception (the caller has verified the bytes), dropped otherwise."""
        with self._tmp_entry(f"blob-{hex_of(digest)}") as tmp:
            try:
                with open(tmp, "xb") as out:
                    yield out
                os.rename(tmp, self.blob_path(digest))
            except OSError as exc:
                raise disk_error(exc, f"storing blob {digest}") from None

    @contextlib.contextmanager
    def scratch(self) -> Iterator[Path]:
        """An empty folder in ``tmp/`` for the block (an export's layers), removed after it."""
        with self._tmp_entry("scratch") as path:
            path.mkdir(mode=0o700)
            yield path

    def _tmp_entry(self, prefix: str):
        return tmp_entries.entry(self.root / "tmp", prefix)

    # -- images and tags --------------------------------------------------------------------

    def _image_path(self, digest: str) -> Path:
        return self.root / "images" / f"{hex_of(digest)}.json"

    def _tag_path(self, ref: str) -> Path:
        return self.root / "tags" / f"{hashlib.sha256(ref.encode()).hexdigest()}.json"

    def image(self, digest: str) -> ImageRecord | None:
        try:
            return ImageRecord.from_json(json.loads(self._image_path(digest).read_text()))
        except (FileNotFoundError, ValueError):
            return None

    def images(self) -> list[ImageRecord]:
        records = []
        for path in sorted((self.root / "images").glob("*.json")):
            record = self.image(f"sha256:{path.stem}")
            if record is not None:
                records.append(record)
        return records

    def resolve_tag(self, ref: str, max_age_secs: float | None = None) -> str | None:
        """The digest ``ref`` (canonical string) was resolved to; None if unknown, or older than
        ``max_age_secs`` (a tag is asked again after IMAGE_TAG_TTL_SECS), or its image is gone."""
        try:
            entry = json.loads(self._tag_path(ref).read_text())
        except (FileNotFoundError, ValueError):
            return None
        if max_age_secs is not None and parse_iso(entry["resolved_at"]) + max_age_secs < dt.datetime.now().timestamp():
            return None
        return entry["digest"] if self._image_path(entry["digest"]).is_file() else None

    def save_layers_as_image(self, digest: str, config: dict, layers: list[str], source: str, refs) -> ImageRecord:
        """The record of an image whose layers are in the store (a pull, an import), saved under ``refs``."""
        record = ImageRecord(
            digest=digest,
            refs=[],
            config=config,
            layers=list(layers),
            size_bytes=sum(self.layer_meta(layer)["size_bytes"] for layer in layers),
            source=source,
            created_at=now_iso(),
            last_used_at=now_iso(),
        )
        return self.save_image(record, refs=refs)

    def save_image(self, record: ImageRecord, refs: list[str] = ()) -> ImageRecord:
        """Write ``record`` (refs merged with an existing one's) and point each of ``refs`` at it."""
        stamp = now_iso()
        with self._lock(f"image-{hex_of(record.digest)}"):
            old = self.image(record.digest)
            known = list(dict.fromkeys([*(old.refs if old else []), *record.refs, *refs]))
            record = dataclasses.replace(
                record, refs=known, created_at=old.created_at if old else record.created_at, last_used_at=stamp
            )
            self._write_json(self._image_path(record.digest), record.to_json())
        for ref in refs:
            self._write_json(self._tag_path(ref), {"ref": ref, "digest": record.digest, "resolved_at": stamp})
        if self._using:
            self._added.append(record.digest)
        return record

    def touch(self, digest: str) -> None:
        with self._lock(f"image-{hex_of(digest)}"):
            record = self.image(digest)
            if record is not None:
                record.last_used_at = now_iso()
                self._write_json(self._image_path(digest), record.to_json())

    def remove(self, ref_or_digest: str) -> ImageRecord:
        """Forget a reference (its image goes when no reference is left) or, by digest, the image and
        all its references. Layers stay until ``prune``. ImageError if unknown or pinned."""
        with self._lock("gc"):
            digest = ref_or_digest if _DIGEST.fullmatch(ref_or_digest) else self.resolve_tag(ref_or_digest)
            record = self.image(digest) if digest else None
            if record is None:
                raise ImageError(f"There is no image {ref_or_digest} in the store.")
            if self.pinned(record.digest):
                raise ImageError(f"The image {ref_or_digest} is in use by an evaluation or a build.")
            drop = record.refs if digest == ref_or_digest else [ref_or_digest]
            for ref in drop:
                with contextlib.suppress(FileNotFoundError):
                    self._tag_path(ref).unlink()
            record.refs = [ref for ref in record.refs if ref not in drop]
            if record.refs:
                self._write_json(self._image_path(record.digest), record.to_json())
            else:
                self._image_path(record.digest).unlink()
            return record

    # -- pins -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def pin(self, digest: str, holder: str) -> Iterator[ImageRecord]:
        """Keep the image ``digest`` from eviction and removal while the block runs (or, if the
        process dies, until its flock goes with it). ``holder`` names the user (an evaluation id)."""
        if not _HOLDER.fullmatch(holder):
            raise ValueError(f"a pin holder is 1 to 128 of A-Z a-z 0-9 _ . -, got {holder!r}")
        folder = self.root / "pins" / hex_of(digest)
        with self._lock("gc", shared=True):
            record = self.image(digest)
            if record is None:
                raise ImageError(f"There is no image {digest} in the store.")
            folder.mkdir(exist_ok=True)
            fd = os.open(folder / holder, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield record
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(folder / holder)
            os.close(fd)

    def pinned(self, digest: str) -> bool:
        """Whether a live process holds a pin on ``digest``; dead holders' pin files are removed."""
        return self._sweep_pins(self.root / "pins" / hex_of(digest))[0]

    @staticmethod
    def _sweep_pins(folder: Path) -> tuple[bool, int]:
        """(whether a live holder pins the image of ``folder``, how many dead holders' files went)."""
        held, removed = False, 0
        for path in folder.glob("*") if folder.is_dir() else ():
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            except (FileNotFoundError, OSError):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held = True
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed += 1
            finally:
                os.close(fd)
        return held, removed

    # -- what dead processes left (the reaper) ----------------------------------------------

    def remove_dead_pins(self) -> int:
        """Pin files whose holder died (an evaluation's worker killed), and the pin folders left empty;
        the number of files removed. Only while no pull or build holds ``using``, else at the next
        pass: ``pin`` creates its file and then locks it under ``using``, and a sweep between the two
        would take a live pin for a dead one (``evict`` and ``remove`` sweep under the same lock)."""
        removed = 0
        with self._lock("gc", wait=False) as held:
            if not held:
                return 0
            for folder in (self.root / "pins").iterdir():
                if _HEX.fullmatch(folder.name):
                    removed += self._sweep_pins(folder)[1]
                    with contextlib.suppress(OSError):  # not empty: a live pin
                        folder.rmdir()
        return removed

    def remove_dead_builds(self, reach: Path | None = None) -> int:
        """Build folders ``builds/<id>/`` (images/build.py) whose ``builds/<id>.lock`` no process holds: a
        killed build's. What is mounted below one (its steps' overlays) is unmounted first; then the
        folder and its lock go. A live build holds its lock from before its folder exists until after
        it is gone, so a free lock beside a folder means a dead build. ``reach``: the folder of the
        builds' roots and /tmp (``WORKSPACE_BASE/`` BUILD_REACH), whose ``<id>/`` go with the same
        rule. Returns how many builds went."""
        builds = self.root / "builds"
        removed = 0
        for entry in sorted(reach.iterdir()) if reach is not None and reach.is_dir() else ():
            if not entry.is_symlink() and entry.is_dir() and not (builds / entry.name).is_dir():
                removed += self._remove_dead_build(entry, builds / f"{entry.name}.lock")
        for entry in sorted(builds.iterdir()) if builds.is_dir() else ():
            if entry.is_symlink() or not entry.is_dir():
                continue
            lock = builds / f"{entry.name}.lock"
            if reach is not None and (reach / entry.name).is_dir():
                self._remove_dead_build(reach / entry.name, lock, keep_lock=True)
            removed += self._remove_dead_build(entry, lock)
        return removed

    @staticmethod
    def _remove_dead_build(entry: Path, lock: Path, *, keep_lock: bool = False) -> int:
        """``entry`` unmounted and removed (with ``lock``) if no process holds ``lock``: 1, else 0."""
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            fd = None  # its lock went first (a crash in its own cleanup): nobody holds it
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.geteuid() == 0:
                mounts.unmount_below(entry)
            safefs.remove_tree_nofollow(entry)
            if not keep_lock:
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
            return 1
        except BlockingIOError:
            return 0  # a live build
        except OSError as exc:  # left for the next pass
            logger.warning("could not remove the dead build %s yet: %s", entry, exc)
            return 0
        finally:
            if fd is not None:
                os.close(fd)

    # -- space ------------------------------------------------------------------------------

    def used_blobs(self, record: ImageRecord) -> set[str]:
        """The blobs an image needs for export: its manifest, config and compressed layers."""
        used = {record.digest}
        try:
            manifest = json.loads(self.blob_path(record.digest).read_bytes())
        except (OSError, ValueError):
            return used
        for descriptor in [manifest.get("config") or {}, *(manifest.get("layers") or [])]:
            if _DIGEST.fullmatch(str(descriptor.get("digest", ""))):
                used.add(descriptor["digest"])
        return used

    def prune(self) -> int:
        """Remove layers, blobs, tags and leftovers no image uses, and what killed pulls and builds
        left (``tmp/``, ``builds/``); the bytes freed."""
        with self._lock("gc"):
            return self._prune()

    def _prune(self) -> int:
        records = self.images()
        layers = {hex_of(layer) for record in records for layer in record.layers}
        blobs = {hex_of(blob) for record in records for blob in self.used_blobs(record)}
        digests = {record.digest for record in records}
        freed = 0
        for path in (self.root / "layers").iterdir():
            if path.name not in layers:
                freed += self._layer_bytes(path)
                safefs.remove_tree_nofollow(path)
        for path in (self.root / "blobs" / "sha256").iterdir():
            if path.name not in blobs:
                freed += path.stat().st_size
                path.unlink()
        for path in (self.root / "tags").glob("*.json"):
            with contextlib.suppress(ValueError, KeyError, FileNotFoundError):
                if json.loads(path.read_text())["digest"] not in digests:
                    path.unlink()
        builds_before = self.builds_bytes()
        self.remove_dead_builds()
        dead_builds = max(0, builds_before - self.builds_bytes())  # a live build may grow meanwhile
        return freed + self.remove_dead_tmp()[1] + dead_builds

    def remove_dead_tmp(self) -> tuple[int, int]:
        """What dead owners left in ``tmp/`` (images/scratch.py): (entries removed, bytes freed)."""
        return tmp_entries.remove_dead(self.root / "tmp")

    def tmp_bytes(self) -> int:
        """What ``tmp/`` holds: things in the making, and what dead processes left there."""
        return tmp_entries.usage(self.root / "tmp")

    def builds_bytes(self) -> int:
        """What ``builds/`` holds on the store's own disk: builds under way, and what killed ones left
        (a step's overlay mounted below is not entered: its layers are counted where they are)."""
        builds = self.root / "builds"
        entries = (
            [entry for entry in builds.iterdir() if entry.is_dir() and not entry.is_symlink()]
            if builds.is_dir()
            else []
        )
        return sum(safefs.tree_usage(entry, one_device=True).bytes for entry in entries)

    def total_bytes(self) -> int:
        """Layers, blobs, ``tmp/`` and ``builds/``: what the store takes of the disk (IMAGES_MAX_BYTES
        counts it, ``image list`` shows it)."""
        layers = sum(self._layer_bytes(path) for path in (self.root / "layers").iterdir())
        blobs = sum(path.stat().st_size for path in (self.root / "blobs" / "sha256").iterdir())
        return layers + blobs + self.tmp_bytes() + self.builds_bytes()

    def evict(self, max_bytes: int, *, wait: bool = True) -> list[ImageRecord]:
        """Remove images, least recently used first, until the store holds at most ``max_bytes``;
        never a pinned image (nor so its layers). Returns the images removed.

        ``wait=False`` (after a pull): give up at once while another pull or build is adding
        layers, rather than wait for it; the next pull evicts."""
        removed: list[ImageRecord] = []
        if self.total_bytes() <= max_bytes:
            return removed
        with self._lock("gc", wait=wait) as held:
            if not held:
                return removed
            self._prune()
            for record in sorted(self.images(), key=lambda r: r.last_used_at):
                if self.total_bytes() <= max_bytes:
                    break
                if self.pinned(record.digest):
                    continue
                for ref in record.refs:
                    with contextlib.suppress(FileNotFoundError):
                        self._tag_path(ref).unlink()
                self._image_path(record.digest).unlink()
                removed.append(record)
                self._prune()
        return removed

    def listing(self) -> list[dict]:
        """What ``manage.py image list`` and GET /images show: one row per reference (an image with two
        tags is two rows), most recently used first; an image no reference names (built without a
        tag, imported from an untagged archive) is one row whose ref is None."""
        rows = []
        for record in sorted(self.images(), key=lambda r: (r.last_used_at, r.digest), reverse=True):
            for ref in sorted(record.refs) or [None]:
                rows.append(
                    {
                        "ref": ref,
                        "digest": record.digest,
                        "size_bytes": record.size_bytes,
                        "last_used_at": record.last_used_at,
                    }
                )
        return rows

    # -- counters ---------------------------------------------------------------------------

    def count(self, name: str) -> None:
        """One more of ``name`` (pulls, builds, cache_hits) in ``counters.json``: a failure to write
        it is logged, never raised (a metric is not worth a failed pull)."""
        if name not in COUNTERS:
            raise ValueError(f"unknown image counter {name!r}")
        try:
            with self._lock("counters"):
                counts = self.counts()
                counts[name] += 1
                self._write_json(self.root / "counters.json", counts)
        except (OSError, ImageUnavailable) as exc:
            logger.warning("could not count an image %s: %s", name, exc)

    def counts(self) -> dict[str, int]:
        return read_counts(self.root)

    @staticmethod
    def _layer_bytes(path: Path) -> int:
        try:
            return int(json.loads((path / "meta.json").read_text())["size_bytes"])
        except (OSError, ValueError, KeyError):
            return safefs.tree_size(path)

    @staticmethod
    def _write_json(path: Path, data: dict) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
        try:
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.rename(tmp, path)
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise disk_error(exc, f"writing {path.name}") from None


def read_counts(root: Path) -> dict[str, int]:
    """The counters of the store at ``root``, 0 each when it has none (nothing is created: /metrics
    reads them from the web process)."""
    try:
        saved = json.loads((Path(root) / "counters.json").read_text())
    except (OSError, ValueError):
        saved = {}
    return {name: int(saved.get(name, 0)) if isinstance(saved, dict) else 0 for name in COUNTERS}


def _root_only(root: Path) -> None:
    """The store's root and its first folders 0700 (what is below them is out of reach then)."""
    for path in (root, *root.iterdir()):
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) != 0o700 and st.st_uid == os.geteuid():
                os.chmod(path, 0o700)


def _spread(folder: Path) -> None:
    """Mark ``folder`` the top of a directory hierarchy for ext4's Orlov allocator (``chattr +T``):
    each folder made in it starts in a block group of its own with free inodes to spare, and the
    tree below it follows. Without a journal, ext4 looks for a new inode past every inode of the
    group freed in the last five minutes (``recently_deleted``, one buffer lookup each); near the
    trees removed just before (sessions, sandboxes, other layers) that was most of an unpack's
    time (bench/RESULTS.md, issue 38: GNU tar of the Debian layer 3.5-8.7 s of system time, 0.8-1.0 s
    in such a folder). Best effort: a file system without the flag is left as it is."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        (flags,) = struct.unpack("i", fcntl.ioctl(fd, _GETFLAGS, struct.pack("i", 0)))
        if not flags & _TOPDIR_FL:
            fcntl.ioctl(fd, _SETFLAGS, struct.pack("i", flags | _TOPDIR_FL))
    except OSError as exc:
        logger.debug("the image store's %s keeps its flags: %s", folder, exc)
    finally:
        os.close(fd)


def _flock_polling(fd: int, mode: int, waiting: Iterable[None]) -> None:
    for _ in waiting:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            continue
    raise ImageUnavailable("Gave up waiting for a lock of the image store.")


def disk_error(exc: OSError, doing: str) -> OSError | ImageUnavailable:
    """ENOSPC and EDQUOT are the host's problem, not the image's: ImageUnavailable; others pass on."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ImageUnavailable(f"The host's disk is full while {doing} in the image store.")
    return exc
