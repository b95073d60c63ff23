"""Images for tests: layers built in Python, a real registry on 127.0.0.1, pushing to it.

* ``layer(member(...), ...)``: the bytes of a layer tar (gzip, zstd or plain) from members
  described in Python; ``tree_layer(path)``: a folder as one layer; ``tree_listing(path)``: what
  an unpacked tree holds, to compare two.
* ``RegistryServer``: Debian's ``docker-registry`` (distribution 2.8) on a free port of
  127.0.0.1 with its config and storage in a temp folder; plain HTTP, or HTTPS with a
  certificate a test CA signs (``tls=True``), or with htpasswd users (``users={...}``).
* ``push_image(registry, "name:tag", layers=[...], config={...})``: pushes blobs and a
  manifest with the registry API itself (no skopeo needed); ``push_index`` pushes a
  manifest list. Both return digests, so tests can pull by digest.
* ``image_config(...)``: the executor's Config for pulling from such a registry.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import gzip
import hashlib
import http.client
import io
import json
import os
import shutil
import socket
import ssl
import stat
import subprocess
import tarfile
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from evaluations.images.store import ImageStore
from evaluations.runtime import killer
from executor_project.config import load
from tests.helpers import environments as environment_helpers
from tests.helpers.httpserver import make_tls_files
from tests.helpers.service import PROJECT

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
OCI_LAYER = {"gzip": "application/vnd.oci.image.layer.v1.tar+gzip", "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
             None: "application/vnd.oci.image.layer.v1.tar"}  # fmt: skip
IMAGE_CACHE = PROJECT / "data" / "cache" / "images"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# A large blob's digests, by the blob object (held here, so its id is never another's): the suite's
# Debian layer (115 MB gzip'd, 350 MB as a tar) is pushed by dozens of tests, and hashing and
# unpacking it took about 3 s a push.
_LARGE = 1 << 20
_digests: dict[int, tuple[bytes, str, str]] = {}


def blob_digests(blob: bytes) -> tuple[str, str]:
    """(the blob's digest, its diff_id: the digest of its uncompressed tar)."""
    known = _digests.get(id(blob))
    if known is not None and known[0] is blob:
        return known[1], known[2]
    digests = sha256(blob), sha256(uncompressed(blob))
    if len(blob) >= _LARGE:
        _digests[id(blob)] = (blob, *digests)
    return digests


# -- layers ------------------------------------------------------------------------------


def member(
    path: str,
    data: bytes | None = None,
    *,
    type: str | None = None,  # noqa: A002 - the tar's word
    mode: int | None = None,
    uid: int = 0,
    gid: int = 0,
    target: str = "",
    devmajor: int = 0,
    devminor: int = 0,
    pax: dict | None = None,
) -> tuple[tarfile.TarInfo, bytes | None]:
    """One tar member: type file (the default with data), dir, symlink, hardlink, fifo, char, block."""
    kind = type or ("file" if data is not None or not path.endswith("/") else "dir")
    types = {
        "file": tarfile.REGTYPE,
        "dir": tarfile.DIRTYPE,
        "symlink": tarfile.SYMTYPE,
        "hardlink": tarfile.LNKTYPE,
        "fifo": tarfile.FIFOTYPE,
        "char": tarfile.CHRTYPE,
        "block": tarfile.BLKTYPE,
    }
    info = tarfile.TarInfo(path)
    info.type = types[kind]
    info.mode = mode if mode is not None else (0o755 if kind == "dir" else 0o644)
    info.uid, info.gid = uid, gid
    info.uname = info.gname = ""
    info.mtime = 1700000000
    info.linkname = target
    info.devmajor, info.devminor = devmajor, devminor
    if pax:
        info.pax_headers = dict(pax)
    if kind == "file":
        data = data or b""
        info.size = len(data)
    return info, data


def layer(*members: tuple[tarfile.TarInfo, bytes | None], compression: str | None = "gzip") -> bytes:
    """The layer blob (tar, then gzip / zstd / none) holding ``members`` in order."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None and info.isreg() else None)
    return compress(raw.getvalue(), compression)


def compress(tar_bytes: bytes, compression: str | None) -> bytes:
    if compression == "gzip":
        return gzip.compress(tar_bytes, mtime=0)
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdCompressor().compress(tar_bytes)
    return tar_bytes


def uncompressed(blob: bytes) -> bytes:
    if blob[:2] == b"\x1f\x8b":
        return gzip.decompress(blob)
    if blob[:4] == b"\x28\xb5\x2f\xfd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(blob)
    return blob


def tree_layer(tree: Path, out: Path) -> None:
    """``tree`` as one gzip'd layer tar at ``out`` (as root, owners and modes kept), by GNU tar; what
    is below dev/, proc/ and sys/ left out (an image brings no device nodes: the sandbox makes /dev)."""
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    skipped = [f"--exclude=./{folder}/*" for folder in ("dev", "proc", "sys")]
    subprocess.run(
        ["tar", "--numeric-owner", "--xattrs", "--sort=name", *skipped, "-C", str(tree), "-czf", str(tmp), "."],
        check=True,
        capture_output=True,
    )
    os.rename(tmp, out)


def tree_listing(tree: Path) -> dict[str, tuple]:
    """Every entry below ``tree``, by its path: type, mode, owner, mtime (not a folder's, which
    making entries in it changes, nor a whiteout's, which is when it was made), size, content digest
    or link target, device number, xattrs, and the first path (sorted) of the same inode for a hard
    link. Two trees unpacked from the same layers are the same tree exactly when their listings are
    equal."""
    listing, first_of_inode = {}, {}
    for path in sorted(tree.rglob("*")):
        st = os.lstat(path)
        kind = stat.S_IFMT(st.st_mode)
        content = (
            hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode)
            else os.readlink(path) if stat.S_ISLNK(st.st_mode) else ""
        )  # fmt: skip
        xattrs = () if stat.S_ISLNK(st.st_mode) else tuple(
            (name, os.getxattr(path, name, follow_symlinks=False)) for name in sorted(os.listxattr(path, follow_symlinks=False))
        )  # fmt: skip
        relpath = str(path.relative_to(tree))
        same_as = first_of_inode.setdefault(st.st_ino, relpath) if not stat.S_ISDIR(st.st_mode) else relpath
        mtime = None if stat.S_ISDIR(st.st_mode) or stat.S_ISCHR(st.st_mode) else st.st_mtime_ns
        listing[relpath] = (kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, mtime, st.st_size, content,
                            st.st_rdev, xattrs, same_as)  # fmt: skip
    return listing


# -- a real registry ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RegistryServer:
    """Debian's docker-registry on 127.0.0.1; ``host`` is what a reference names (host:port)."""

    tls: bool = False
    users: dict[str, str] = field(default_factory=dict)  # htpasswd users: Basic auth demanded
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="te-registry-")))
    port: int = 0
    ca: Path | None = None
    process: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"{'localhost' if self.tls else '127.0.0.1'}:{self.port}"

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def start(self) -> RegistryServer:
        if shutil.which("docker-registry") is None:
            raise RuntimeError("docker-registry is not installed (apt-get install -y docker-registry)")
        self.port = _free_port()
        lines = [
            "version: 0.1",
            "log: {level: warn}",
            f"storage: {{filesystem: {{rootdirectory: {self.folder / 'data'}}}, delete: {{enabled: true}}}}",
            "http:",
            f"  addr: 127.0.0.1:{self.port}",
            f"  secret: {os.urandom(8).hex()}",
        ]
        if self.tls:
            self.ca, cert, key = make_tls_files(self.folder / "tls", ("localhost",))
            lines += ["  tls:", f"    certificate: {cert}", f"    key: {key}"]
        if self.users:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                import crypt  # bcrypt through libxcrypt; the registry reads only bcrypt hashes

                entries = [
                    f"{user}:{crypt.crypt(pw, crypt.mksalt(crypt.METHOD_BLOWFISH))}" for user, pw in self.users.items()
                ]
            (self.folder / "htpasswd").write_text("\n".join(entries) + "\n")
            lines += ["auth:", "  htpasswd:", "    realm: test-realm", f"    path: {self.folder / 'htpasswd'}"]
        (self.folder / "config.yml").write_text("\n".join(lines) + "\n")
        self.log = open(self.folder / "registry.log", "wb")  # noqa: SIM115 - closed by stop()
        self.process = subprocess.Popen(
            ["docker-registry", "serve", str(self.folder / "config.yml")], stdout=self.log, stderr=subprocess.STDOUT
        )
        # Not a command: a Spawner in this process (an in-process evaluation) kills every other child
        # of it in its sweep, and the session's registry would go with the first evaluation.
        killer.protect(self.process.pid)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("docker-registry stopped: " + (self.folder / "registry.log").read_text()[-2000:])
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            time.sleep(0.05)
        raise RuntimeError("docker-registry did not listen within 30 s")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> RegistryServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the registry API, as a pusher ------------------------------------------------------

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        """(status, headers, body) of one request to the registry, with Basic auth as its first user."""
        if self.tls:
            context = ssl.create_default_context(cafile=str(self.ca))
            conn = http.client.HTTPSConnection("localhost", self.port, context=context, timeout=60)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        sent = dict(headers or {})
        if self.users:
            user, password = next(iter(self.users.items()))
            sent["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def put_blob(self, repository: str, data: bytes) -> str:
        digest = blob_digests(data)[0] if len(data) >= _LARGE else sha256(data)
        status, _, _ = self.request("HEAD", f"/v2/{repository}/blobs/{digest}")
        if status == 200:
            return digest
        status, headers, body = self.request("POST", f"/v2/{repository}/blobs/uploads/")
        assert status == 202, (status, body)
        location = headers["Location"]
        path = location.split("://", 1)[-1].split("/", 1)[-1] if "://" in location else location.lstrip("/")
        separator = "&" if "?" in path else "?"
        status, _, body = self.request(
            "PUT",
            f"/{path}{separator}digest={digest}",
            body=data,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(data))},
        )
        assert status == 201, (status, body)
        return digest

    def put_manifest(self, repository: str, reference: str, manifest: dict, media_type: str) -> str:
        body = json.dumps(manifest, indent=1).encode()
        status, _, answer = self.request(
            "PUT", f"/v2/{repository}/manifests/{reference}", body=body, headers={"Content-Type": media_type}
        )
        assert status == 201, (status, answer)
        return sha256(body)


@dataclass
class Pushed:
    ref: str  # host:port/name:tag
    digest: str  # manifest digest
    layers: list[str]  # blob digests
    diff_ids: list[str]
    config_digest: str


def push_image(
    registry: RegistryServer,
    name_tag: str,
    *,
    layers: list[bytes],
    config: dict | None = None,
    oci: bool = False,
    architecture: str = "amd64",
    diff_ids: list[str] | None = None,
) -> Pushed:
    """Push ``layers`` (blobs, bottom first) and an image config whose ``config`` is ``config``.

    ``diff_ids`` overrides the computed ones (to push a lying config). Returns the digests."""
    repository, _, tag = name_tag.partition(":")
    tag = tag or "latest"
    computed = [blob_digests(blob)[1] for blob in layers]
    image_config = {
        "architecture": architecture,
        "os": "linux",
        "config": config or {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids or computed},
        "history": [{"created_by": "tests/helpers/images.py"} for _ in layers],
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_digest = registry.put_blob(repository, config_bytes)
    descriptors = []
    for blob in layers:
        digest = registry.put_blob(repository, blob)
        kind = "gzip" if blob[:2] == b"\x1f\x8b" else "zstd" if blob[:4] == b"\x28\xb5\x2f\xfd" else None
        descriptors.append({"mediaType": OCI_LAYER[kind] if oci else LAYER_GZIP, "size": len(blob), "digest": digest})
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST if oci else MANIFEST_V2,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json"
            if oci
            else "application/vnd.docker.container.image.v1+json",
            "size": len(config_bytes),
            "digest": config_digest,
        },
        "layers": descriptors,
    }
    digest = registry.put_manifest(repository, tag, manifest, manifest["mediaType"])
    return Pushed(
        f"{registry.host}/{repository}:{tag}", digest, [d["digest"] for d in descriptors], computed, config_digest
    )


def push_index(
    registry: RegistryServer, name_tag: str, entries: list[tuple[Pushed, dict]], *, oci: bool = False
) -> str:
    """A manifest list (or OCI index) at ``name_tag`` of (image, platform) pairs; its digest. The images
    must have been pushed to the same repository (a registry links only its own manifests)."""
    repository, _, tag = name_tag.partition(":")
    media = OCI_INDEX if oci else MANIFEST_LIST
    manifests = []
    for pushed, platform in entries:
        status, headers, body = registry.request(
            "GET", f"/v2/{repository}/manifests/{pushed.digest}", headers={"Accept": f"{MANIFEST_V2}, {OCI_MANIFEST}"}
        )
        assert status == 200, (status, body)
        manifests.append(
            {"mediaType": headers["Content-Type"], "size": len(body), "digest": pushed.digest, "platform": platform}
        )
    return registry.put_manifest(
        repository, tag, {"schemaVersion": 2, "mediaType": media, "manifests": manifests}, media
    )


def image_config(registry: RegistryServer | None = None, **env: str):
    """A Config whose registry settings reach ``registry`` (plain HTTP unless TLS; its address
    allowed as a private one), with ``env`` on top (variable names as keys)."""
    values = {"DATA_DIR": tempfile.gettempdir(), "DOWNLOAD_TIMEOUT_SECS": "30"}
    if registry is not None:
        values["ALLOWED_PRIVATE_HOSTS"] = "127.0.0.1,localhost,::1"
        if not registry.tls:
            values["IMAGE_INSECURE_REGISTRIES"] = registry.host
        else:
            values["SSL_CERT_FILE"] = str(registry.ca)
    values.update(env)
    return load(values)


def seed_image_store(images_dir: Path, layer: Path) -> Path:
    """``images_dir``, a new image store holding ``layer`` (hard links: 0.2 s against the 2 s of a pull's
    unpack; nothing writes a stored layer, overlays take an image's writes). A pull of an image made of
    it then fetches its manifest and config from the registry and finds the layer there, as on a host
    that pulled the base before; a test of the cold pull itself uses a store of its own, unseeded."""
    store = ImageStore(images_dir)  # its folders as the store makes them
    subprocess.run(["cp", "-al", str(layer), str(store.root / "layers" / layer.name)], check=True)
    return images_dir


# -- a fake registry, for what a real one never does ------------------------------------


class FakeRegistry:
    """Serves one image from ``server`` (a started TestHTTPServer) as a registry would, with the
    misbehaviour a test asks for: a blob whose bytes do not match its digest (``corrupt``), every
    blob held half sent until that many manifests were asked for (``hold_until_manifests``: two
    pullers are then both under way, whatever the machine's load), a Bearer token demanded (``token``)
    from ``realm`` (default the server's own ``/token``), blobs redirected to ``cdn`` (another
    TestHTTPServer, named as ``cdn_host`` when given). ``blob_gets`` counts the GETs of each blob;
    ``authorizations`` records the Authorization header of each request to the registry,
    ``cdn_authorizations`` of each to the CDN."""

    def __init__(self, server, repository: str, tag: str, layers: list[bytes], *, config: dict | None = None,
                 corrupt: int | None = None, hold_until_manifests: int = 0, token: str | None = None,
                 cdn=None, realm: str | None = None, cdn_host: str | None = None):  # fmt: skip
        self.server, self.repository, self.tag = server, repository, tag
        self.realm = realm
        self.blob_gets: dict[str, int] = {}
        self.authorizations: list[str] = []
        self.cdn_authorizations: list[str] = []
        self.token, self.hold_until_manifests = token, hold_until_manifests
        self.manifest_gets = 0
        self.changed = threading.Condition()
        diff_ids = [sha256(uncompressed(blob)) for blob in layers]
        config_bytes = json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": config or {},
                "rootfs": {"type": "layers", "diff_ids": diff_ids},
            }
        ).encode()
        self.blobs = {sha256(config_bytes): config_bytes, **{sha256(blob): blob for blob in layers}}
        self.layer_digests = [sha256(blob) for blob in layers]
        if corrupt is not None:  # the manifest names the real digest; the server sends the same tar
            real = self.layer_digests[corrupt]  # gzip'd with another mtime: valid, same size, other digest
            self.blobs[real] = gzip.compress(uncompressed(self.blobs[real]), mtime=12345)
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_V2,
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config_bytes),
                       "digest": sha256(config_bytes)},
            "layers": [{"mediaType": LAYER_GZIP, "size": len(blob), "digest": sha256(blob)} for blob in layers],
        }  # fmt: skip
        self.manifest = json.dumps(manifest).encode()
        self.digest = sha256(self.manifest)
        server.route(f"/v2/{repository}/manifests/{tag}", self._manifest)
        server.route(f"/v2/{repository}/manifests/{self.digest}", self._manifest)
        server.route("/token", self._token)
        for digest, body in self.blobs.items():
            path = f"/v2/{repository}/blobs/{digest}"
            if cdn is not None and digest in self.layer_digests:
                cdn.route(f"/cdn/{digest}", self._blob(digest, body))
                server.route(path, self._redirect(cdn.url(f"/cdn/{digest}", host=cdn_host)))
            else:
                server.route(path, self._blob(digest, body))

    @property
    def ref(self) -> str:
        return f"127.0.0.1:{self.server.port}/{self.repository}:{self.tag}"

    def _authorized(self, req) -> bool:
        self.authorizations.append(req.headers.get("Authorization", ""))
        if self.token is None or req.headers.get("Authorization") == f"Bearer {self.token}":
            return True
        realm = self.realm or self.server.url("/token")
        req.send_response(401)
        req.send_header(
            "WWW-Authenticate", f'Bearer realm="{realm}",service="fake",scope="repository:{self.repository}:pull"'
        )
        req.send_header("Content-Length", "0")
        req.end_headers()
        return False

    def _token(self, req) -> None:
        body = json.dumps({"token": self.token}).encode()
        req.send_response(200)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    def _manifest(self, req) -> None:
        if not self._authorized(req):
            return
        with self.changed:
            self.manifest_gets += 1
            self.changed.notify_all()
        req.send_response(200)
        req.send_header("Content-Type", MANIFEST_V2)
        req.send_header("Content-Length", str(len(self.manifest)))
        req.end_headers()
        req.wfile.write(self.manifest)

    def _redirect(self, location: str):
        def handle(req) -> None:
            if self._authorized(req):
                req.send_response(307)
                req.send_header("Location", location)
                req.send_header("Content-Length", "0")
                req.end_headers()

        return handle

    def _blob(self, digest: str, body: bytes):
        def handle(req) -> None:
            if req.path.startswith("/v2/") and not self._authorized(req):
                return
            if not req.path.startswith("/v2/"):
                self.cdn_authorizations.append(req.headers.get("Authorization", ""))
            self.blob_gets[digest] = self.blob_gets.get(digest, 0) + 1
            req.send_response(200)
            req.send_header("Content-Length", str(len(body)))
            req.end_headers()
            half = len(body) // 2
            req.wfile.write(body[:half])
            req.wfile.flush()
            with self.changed:
                held = self.changed.wait_for(lambda: self.manifest_gets >= self.hold_until_manifests, timeout=120)
            assert held, f"{self.hold_until_manifests} manifest requests never came ({self.manifest_gets})"
            req.wfile.write(body[half:])

        return handle


# -- the suite's registry and base image (fixtures in tests/conftest.py) -----------------------


def need_registry() -> None:
    if shutil.which("docker-registry") is None:
        reason = "docker-registry is not installed (apt-get install -y docker-registry)"
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail(f"REQUIRE_SANDBOX=1 but {reason}")
        pytest.skip(reason)


def need_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail("REQUIRE_SANDBOX=1 but the image tests need root (owners, device nodes, overlay xattrs)")
        pytest.skip("unpacking layers needs root (owners, whiteout devices, trusted.* xattrs)")


def base_layer_tarball(debian_root) -> Path:
    """The suite's Debian tree as one gzip'd layer tar, kept in data/cache/images between runs (named
    after the debootstrap tarball it comes from); built from ``debian_environment`` only when missing."""
    debootstrap = environment_helpers.cached_tarball()
    out = IMAGE_CACHE / f"{debootstrap.name.removesuffix('.tar.gz')}-layer.tar.gz"
    IMAGE_CACHE.mkdir(parents=True, exist_ok=True)
    with open(IMAGE_CACHE / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_file():
            tree_layer(debian_root(), out)
    return out
