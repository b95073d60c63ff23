"""Images to and from archive files: ``docker save`` tarballs and OCI layout archives.

Import reads the archive's members by name and never extracts it: every blob is hashed against
its digest, every layer unpacked by the same code as a pull (``unpack_layer``: diff_id checked,
hostile members refused), so an archive is trusted no more than a registry.

Export writes what ``skopeo inspect docker-archive:PATH`` / ``oci-archive:PATH`` read: the blobs as
pulled when the store has them, else (a built image) each layer tree tarred back in a fixed
order, with fixed tar headers, overlay whiteouts turned back into ``.wh.`` entries, so the same
tree always gives the same digest.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

from evaluations import safefs
from evaluations.images.errors import ImageError
from evaluations.images.pull import choose_platform, json_object, sha256_of
from evaluations.images.reference import parse
from evaluations.images.store import ImageRecord, ImageStore, disk_error, hex_of
from evaluations.images.unpack import OPAQUE, WHITEOUT, DigestReader, ImageCaps, decompressed, unpack_layer

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
_OCI_LAYER = {
    "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
    "": "application/vnd.oci.image.layer.v1.tar",
}
_DOCKER_LAYER = {
    "gzip": "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "": "application/vnd.docker.image.rootfs.diff.tar",
}
MAX_JSON_BYTES = 16 * 1024 * 1024


# -- import ------------------------------------------------------------------------------


def import_archive(path: Path | str, store: ImageStore, config=None) -> list[ImageRecord]:
    """Every image of the archive at ``path`` into ``store``; ImageError naming what is wrong.
    ``config``: each image within its IMAGE_MAX_UNPACKED_BYTES and IMAGE_MAX_FILES, as a pull is."""
    try:
        archive = tarfile.open(path, "r:*")
    except OSError as exc:
        raise ImageError(f"The image archive {path} cannot be read ({exc.strerror}).") from None
    except tarfile.TarError:  # its text lists each compression tried, one per line
        raise ImageError(f"The image archive {path} cannot be read as a tar file (plain, gzip, bzip2 or xz).") from None
    with archive, store.using():
        members = {_clean(member.name): member for member in archive.getmembers() if member.isreg()}
        reader = _ArchiveReader(archive, members, str(path))
        if "oci-layout" in members and "index.json" in members:
            return _import_oci(reader, store, config)
        if "manifest.json" in members:
            return _import_docker(reader, store, config)
    raise ImageError(
        f"The image archive {path} has neither manifest.json (docker save) nor oci-layout and index.json (OCI)."
    )


class _ArchiveReader:
    def __init__(self, archive: tarfile.TarFile, members: dict[str, tarfile.TarInfo], name: str):
        self.archive, self.members, self.name = archive, members, name

    def open(self, member_name: str):
        member = self.members.get(_clean(member_name))
        if member is None:
            raise ImageError(f"The image archive {self.name} has no member {member_name!r}.")
        return self.archive.extractfile(member)

    def json(self, member_name: str) -> object:
        data = self.open(member_name).read(MAX_JSON_BYTES + 1)
        if len(data) > MAX_JSON_BYTES:
            raise ImageError(f"{member_name!r} of the image archive {self.name} is larger than {MAX_JSON_BYTES} bytes.")
        try:
            return json.loads(data)
        except ValueError:
            raise ImageError(f"{member_name!r} of the image archive {self.name} is not valid JSON.") from None

    def blob(self, digest: str) -> bytes:
        data = self.open(f"blobs/sha256/{_hex(digest, self.name)}").read()
        if sha256_of(data) != digest:
            raise ImageError(f"The blob {digest} of the image archive {self.name} does not match its digest.")
        return data

    def digest_of(self, member_name: str) -> str:
        reader = DigestReader(self.open(member_name))
        reader.drain()
        return reader.digest


def _import_docker(reader: _ArchiveReader, store: ImageStore, config) -> list[ImageRecord]:
    entries = reader.json("manifest.json")
    if not isinstance(entries, list) or not entries:
        raise ImageError(f"manifest.json of the image archive {reader.name} is not a list of images.")
    records = []
    for entry in entries:
        config_bytes = reader.open(str(entry.get("Config", ""))).read(MAX_JSON_BYTES)
        layers = [(str(name), reader.digest_of(str(name))) for name in entry.get("Layers") or []]
        config_json = json_object(config_bytes, f"The config of the image archive {reader.name}")
        diff_ids = _diff_ids(config_json, len(layers), reader.name)
        caps = _caps(config)
        for (name, blob), diff_id in zip(layers, diff_ids, strict=True):
            _add_layer(store, reader, name, blob, diff_id, caps)
        manifest = {
            "schemaVersion": 2,
            "mediaType": DOCKER_MANIFEST,
            "config": {"mediaType": DOCKER_CONFIG, "size": len(config_bytes), "digest": sha256_of(config_bytes)},
            "layers": [
                {
                    "mediaType": _DOCKER_LAYER.get(_compression(store, blob), _DOCKER_LAYER[""]),
                    "size": _size(store, blob),
                    "digest": blob,
                }
                for _, blob in layers
            ],
        }
        refs = [str(parse(tag)) for tag in entry.get("RepoTags") or []]
        records.append(_save(store, _canonical(manifest), config_bytes, config_json, diff_ids, refs))
    return records


def _import_oci(reader: _ArchiveReader, store: ImageStore, config) -> list[ImageRecord]:
    index = reader.json("index.json")
    if not isinstance(index, dict):
        raise ImageError(f"index.json of the image archive {reader.name} is not an OCI index.")
    records = []
    for entry in index.get("manifests") or []:
        digest = str(entry.get("digest", ""))
        body = reader.blob(digest)
        manifest = json_object(body, f"The manifest {digest} of the image archive {reader.name}")
        if "manifests" in manifest:  # a nested index: this platform's image
            digest = choose_platform(manifest, reader.name)
            body = reader.blob(digest)
            manifest = json_object(body, f"The manifest {digest} of the image archive {reader.name}")
        config_digest = str((manifest.get("config") or {}).get("digest", ""))
        config_bytes = reader.blob(config_digest)
        config_json = json_object(config_bytes, f"The config of the image archive {reader.name}")
        layers = [str(layer.get("digest", "")) for layer in manifest.get("layers") or []]
        diff_ids = _diff_ids(config_json, len(layers), reader.name)
        caps = _caps(config)
        for blob, diff_id in zip(layers, diff_ids, strict=True):
            name = f"blobs/sha256/{_hex(blob, reader.name)}"
            if reader.digest_of(name) != blob:
                raise ImageError(f"Layer {blob} of the image archive {reader.name} does not match its digest.")
            _add_layer(store, reader, name, blob, diff_id, caps)
        annotations = entry.get("annotations") or {}
        name = annotations.get("io.containerd.image.name") or annotations.get("org.opencontainers.image.ref.name") or ""
        refs = [str(parse(name))] if ("/" in name or ":" in name) else []
        records.append(_save(store, body, config_bytes, config_json, diff_ids, refs))
    return records


def _caps(config) -> ImageCaps:
    return ImageCaps.of(config) if config is not None else ImageCaps(float("inf"), float("inf"))


def _add_layer(store: ImageStore, reader: _ArchiveReader, name: str, blob: str, diff_id: str, caps: ImageCaps) -> None:
    """Unpack the member ``name`` as layer ``diff_id`` unless the store has it; keep it as blob ``blob``.
    The layer counts against the image's ``caps`` either way."""

    def populate(tree):
        with store.new_blob(blob) as keep:
            raw = DigestReader(_Tee(reader.open(name), keep))
            counts = unpack_layer(raw, tree, layer=blob, diff_id=diff_id, caps=caps)
            raw.drain()
        return counts.as_meta()

    if not store.has_layer(diff_id):
        store.add_layer(diff_id, populate)
        return
    caps.count_stored(blob, store.layer_meta(diff_id))
    if not store.has_blob(blob):
        with store.new_blob(blob) as keep:
            _Tee(reader.open(name), keep).drain()


def _save(store, manifest: bytes, config_bytes: bytes, config_json: dict, diff_ids, refs) -> ImageRecord:
    digest = sha256_of(manifest)
    store.put_blob(digest, manifest)
    store.put_blob(sha256_of(config_bytes), config_bytes)
    return store.save_layers_as_image(digest, config_json.get("config") or {}, diff_ids, "import", refs)


class _Tee:
    def __init__(self, source, keep):
        self.source, self.keep = source, keep

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size if size and size > 0 else 1 << 20)
        if data:
            try:
                self.keep.write(data)
            except OSError as exc:
                raise disk_error(exc, "storing an imported blob") from None
        return data

    def drain(self) -> None:
        while self.read(1 << 20):
            pass


# -- export ------------------------------------------------------------------------------


def export_image(store: ImageStore, record: ImageRecord, path: Path | str, format: str = "docker") -> None:  # noqa: A002
    """Write ``record`` as a ``docker save`` tarball (``format="docker"``) or an OCI layout archive."""
    if format not in ("docker", "oci"):
        raise ValueError(f"format is docker or oci, not {format!r}")
    path = Path(path)
    with store.scratch() as scratch:
        layers, config_bytes = _export_layers(store, record, Path(scratch))
        if format == "docker":  # docker save's layers are plain tars, named by their diff_id
            layers = [_plain(blob, file, compression, Path(scratch)) for blob, file, compression in layers]
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as out:
                if format == "docker":
                    _write_docker(out, record, layers, config_bytes)
                else:
                    _write_oci(out, record, layers, config_bytes)
            os.rename(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()


def _export_layers(store: ImageStore, record: ImageRecord, scratch: Path) -> tuple[list[tuple[str, Path, str]], bytes]:
    """[(blob digest, file, compression)] bottom first, and the config that names their diff_ids."""
    manifest = None
    if store.has_blob(record.digest):
        manifest = json.loads(store.blob_path(record.digest).read_bytes())
    stored = [str(layer.get("digest", "")) for layer in (manifest or {}).get("layers") or []]
    config_digest = str(((manifest or {}).get("config") or {}).get("digest", ""))
    if len(stored) == len(record.layers) and all(store.has_blob(blob) for blob in [*stored, config_digest]):
        layers = [(blob, store.blob_path(blob), _compression(store, blob)) for blob in stored]
        return layers, store.blob_path(config_digest).read_bytes()
    layers, diff_ids = [], []
    for number, layer_id in enumerate(record.layers):
        out = scratch / f"layer{number}.tar.gz"
        diff_id, blob = tar_layer_tree(store.layer_tree(layer_id), out)
        layers.append((blob, out, "gzip"))
        diff_ids.append(diff_id)
    arch = os.uname().machine
    config = {
        "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(arch, arch),
        "os": "linux",
        "config": record.config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    return layers, _canonical(config)


def tar_layer_tree(tree: Path, out: Path) -> tuple[str, str]:
    """The layer tree ``tree`` as a gzip'd layer tar at ``out``; (diff_id, blob digest).

    Deterministic: entries sorted by path, headers from the files (mode, owner, mtime, no user or
    group names), gzip without a timestamp. An overlay whiteout (char 0/0) becomes ``.wh.NAME``, an
    opaque folder gets a ``.wh..wh..opq`` entry; hard links within the tree stay hard links."""
    plain = hashlib.sha256()
    with open(out, "wb") as raw:
        blob = _HashingWriter(raw)
        with gzip.GzipFile(fileobj=blob, mode="wb", mtime=0, filename="") as gz:
            tee = _HashingWriter(gz, plain)
            with tarfile.open(fileobj=tee, mode="w|", format=tarfile.PAX_FORMAT) as archive:
                seen: dict[tuple[int, int], str] = {}
                for relative, folder, name in _sorted_walk(tree):
                    _add_entry(archive, folder, name, relative, seen)
    return "sha256:" + plain.hexdigest(), "sha256:" + blob.sha256.hexdigest()


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def write_folder_tar(folder_fd: int, out, shown: str, mounts: dict[str, int] | None = None) -> None:
    """The folder behind ``folder_fd`` (a handle: resolved by the caller, inside a root) as a plain
    tar on ``out``: its entries, folders included, names relative to it, links as links, owners
    as the host has them. A live sandbox's ``GET .../files`` of a folder (SPEC §24). ``mounts``: a
    folder handle (the caller's) by the relative path of a folder below that it is bound over (a
    compose volume): that folder's contents are the handle's, as the sandbox sees them."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        seen: dict[tuple[int, int], str] = {}
        for relative, folder, name in _spliced_walk(folder_fd, shown, mounts or {}):
            _add_entry(archive, folder, name, relative, seen)


def _spliced_walk(tree: int, shown: str, mounts: dict[str, int]) -> Iterator[tuple[str, int, str]]:
    """``_sorted_walk`` of ``tree``, each folder named in ``mounts`` walked in its handle instead."""
    for relative, folder, name in _sorted_walk(tree, shown, skip=frozenset(mounts)):
        yield relative, folder, name
        if relative in mounts and stat.S_ISDIR(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
            inner = {path[len(relative) + 1 :]: fd for path, fd in mounts.items() if path.startswith(relative + "/")}
            for below, below_folder, below_name in _spliced_walk(mounts[relative], shown, inner):
                yield f"{relative}/{below}", below_folder, below_name


def _sorted_walk(
    tree: Path | int, shown: str | None = None, skip: frozenset[str] = frozenset()
) -> Iterator[tuple[str, int, str]]:
    """(relative POSIX path, its folder's handle, its name) of every entry below ``tree`` (a path,
    or a folder's handle, which stays the caller's), depth first in name order, parents before
    their children; links never followed; the folders named in ``skip`` listed, not entered.

    From handles, as commit.py's walk (SPEC §21): one folder handle open at a time, the names
    still to visit kept per level, the way back up ``..`` checked to be the folder left, so a
    tree deeper than ``PATH_MAX`` exports like any other."""
    fd = os.open(".", _DIR_FLAGS, dir_fd=tree) if isinstance(tree, int) else os.open(tree, _DIR_FLAGS)
    tree = shown or tree
    here = os.fstat(fd)
    frames = [("", sorted(os.listdir(fd), reverse=True), (here.st_dev, here.st_ino))]  # (relpath, names left, id)
    try:
        while frames:
            relpath, left, _ = frames[-1]
            if not left:
                frames.pop()
                if frames:
                    parent = safefs.up_to_parent(
                        fd, frames[-1][2], f"the layer's tree changed while it was exported: {tree}"
                    )
                    os.close(fd)
                    fd = parent
                continue
            name = left.pop()
            relative = f"{relpath}/{name}" if relpath else name
            yield relative, fd, name
            if relative not in skip and stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
                here = os.fstat(fd)
                frames.append((relative, sorted(os.listdir(fd), reverse=True), (here.st_dev, here.st_ino)))
    finally:
        os.close(fd)


def _add_entry(archive: tarfile.TarFile, folder: int, name: str, relative: str, seen: dict) -> None:
    st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    info = tarfile.TarInfo(relative)
    info.mode, info.uid, info.gid, info.mtime = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, int(st.st_mtime)
    info.uname = info.gname = ""
    data = None
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
        parent, _, base = relative.rpartition("/")
        info.name = f"{parent}/{WHITEOUT}{base}" if parent else f"{WHITEOUT}{base}"
        info.type, info.mode, info.uid, info.gid = tarfile.REGTYPE, 0o644, 0, 0
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        archive.addfile(info)
        try:
            through = f"/proc/self/fd/{folder}/{name}"  # the entry itself, never followed
            opaque = os.getxattr(through, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
        except OSError:
            opaque = False
        if opaque:
            marker = tarfile.TarInfo(f"{relative}/{OPAQUE}")
            marker.mtime, marker.uname, marker.gname = info.mtime, "", ""
            archive.addfile(marker)
        return
    elif stat.S_ISLNK(st.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=folder)
    elif stat.S_ISFIFO(st.st_mode):
        info.type = tarfile.FIFOTYPE
    elif stat.S_ISREG(st.st_mode):
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in seen:
            info.type, info.linkname = tarfile.LNKTYPE, seen[key]
        else:
            seen[key] = relative
            info.size = st.st_size
            data = os.fdopen(os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder), "rb")
    else:
        return  # sockets: nothing a layer carries
    try:
        archive.addfile(info, data)
    finally:
        if data is not None:
            data.close()


class _HashingWriter:
    def __init__(self, target, sha256=None):
        self.target = target
        self.sha256 = sha256 or hashlib.sha256()

    def write(self, data) -> int:
        self.sha256.update(data)
        self.target.write(data)
        return len(data)

    def flush(self) -> None:
        self.target.flush()


def _plain(blob: str, file: Path, compression: str, scratch: Path) -> tuple[str, Path, str]:
    """(diff_id, an uncompressed copy, "") of a layer blob; itself when it is a plain tar."""
    if not compression:
        return blob, file, ""
    out = scratch / f"{hex_of(blob)}.tar"
    with open(file, "rb") as source, open(out, "wb") as target:
        reader = DigestReader(decompressed(source))
        while chunk := reader.read(1 << 20):
            target.write(chunk)
    return reader.digest, out, ""


def _write_docker(out: tarfile.TarFile, record: ImageRecord, layers, config_bytes: bytes) -> None:
    config_name = f"blobs/sha256/{hex_of(sha256_of(config_bytes))}"
    _add_bytes(out, config_name, config_bytes)
    names = []
    for blob, file, _compression_name in layers:
        name = f"blobs/sha256/{hex_of(blob)}"
        if name not in names:
            out.add(file, arcname=name, filter=_fixed)
        names.append(name)
    tags = [ref for ref in record.refs if "@" not in ref]
    _add_bytes(out, "manifest.json", _canonical([{"Config": config_name, "RepoTags": tags, "Layers": names}]))


def _write_oci(out: tarfile.TarFile, record: ImageRecord, layers, config_bytes: bytes) -> None:
    manifest = _canonical(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "size": len(config_bytes), "digest": sha256_of(config_bytes)},
            "layers": [
                {"mediaType": _OCI_LAYER[compression], "size": file.stat().st_size, "digest": blob}
                for blob, file, compression in layers
            ],
        }
    )
    _add_bytes(out, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    entry = {"mediaType": OCI_MANIFEST, "size": len(manifest), "digest": sha256_of(manifest)}
    tags = [ref for ref in record.refs if "@" not in ref]
    if tags:
        entry["annotations"] = {"org.opencontainers.image.ref.name": tags[0]}
    _add_bytes(out, "index.json", _canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]}))
    _add_bytes(out, "blobs/sha256/" + hex_of(sha256_of(manifest)), manifest)
    _add_bytes(out, "blobs/sha256/" + hex_of(sha256_of(config_bytes)), config_bytes)
    written = set()
    for blob, file, _compression_name in layers:
        if blob not in written:
            out.add(file, arcname=f"blobs/sha256/{hex_of(blob)}", filter=_fixed)
            written.add(blob)


def _add_bytes(out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = _fixed(tarfile.TarInfo(name))
    info.size = len(data)
    out.addfile(info, io.BytesIO(data))


def _fixed(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mode, info.uid, info.gid, info.uname, info.gname, info.mtime = 0o644, 0, 0, "", "", 0
    return info


# -- small helpers -----------------------------------------------------------------------


def _compression(store: ImageStore, blob: str) -> str:
    with open(store.blob_path(blob), "rb") as handle:
        head = handle.read(4)
    return "gzip" if head[:2] == b"\x1f\x8b" else "zstd" if head == b"\x28\xb5\x2f\xfd" else ""


def _size(store: ImageStore, blob: str) -> int:
    return store.blob_path(blob).stat().st_size


def _diff_ids(config_json: dict, count: int, name: str) -> list[str]:
    diff_ids = (config_json.get("rootfs") or {}).get("diff_ids") or []
    if len(diff_ids) != count:
        raise ImageError(f"An image of the archive {name} has {count} layers but its config {len(diff_ids)} diff_ids.")
    for diff_id in diff_ids:
        _hex(str(diff_id), name)
    return [str(diff_id) for diff_id in diff_ids]


def _hex(digest: str, name: str) -> str:
    try:
        return hex_of(digest)
    except ValueError:
        raise ImageError(f"The image archive {name} names the digest {digest[:80]!r}, not sha256:<64 hex>.") from None


def _clean(name: str) -> str:
    return "/".join(part for part in name.split("/") if part not in ("", "."))


def _canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
