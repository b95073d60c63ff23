"""``pull(ref)``: an image from its registry into the store, each layer verified and unpacked once.

1. A tag resolved less than IMAGE_TAG_TTL_SECS ago, or a digest reference the store has, is
   answered from the store with no network at all.
2. Otherwise the manifest is fetched (an index or manifest list is narrowed to linux and this
   machine's architecture), then the image config, whose ``rootfs.diff_ids`` tell which layers
   the store already has *before* any layer is downloaded.
3. A missing layer is streamed once: its compressed bytes are hashed (against the manifest's
   digest and size) and kept as a blob for export, its uncompressed bytes hashed (against the
   diff_id) and unpacked, in one pass. The store's flock per layer makes a second process pulling
   the same image wait and reuse it instead of downloading it again.
3a. The layers the store has are counted first (an image over a cap fails before anything is
   unpacked). The missing ones are fetched LAYERS_AT_ONCE at a time, each in a thread of its own
   as above (unpacked by two threads, unpack.py). A diff_id the image lists twice is fetched
   once, its repeats counted when their turn comes. Progress is said in the manifest's order.
   The first layer to fail stops the others (``PullClock.stop``: their connections shut, their
   unpacks end, what they made in ``tmp/`` removed with its lock); no thread outlives the pull.
   The pull's error is that of the layer first in the manifest among those that failed of
   themselves (not because they were stopped). Two layers unpacked together count against the
   caps together: the one named is the one whose member would have crossed it.
4. A pull that downloaded no layer counts as a cache hit (``term_executor_image_cache_hits_total``),
   any other as a pull; the store then evicts down to IMAGES_MAX_BYTES (store.using).
5. The image's caps (IMAGE_MAX_UNPACKED_BYTES, IMAGE_MAX_FILES) count every layer, stored ones by
   their meta, new ones member by member before anything lands (unpack.ImageCaps). The pull's
   clock (deadline.py) bounds it all: IMAGE_PULL_TIMEOUT_SECS, the evaluation's cancel, and a
   blob that stalls for IMAGE_FETCH_STALL_SECS. A blob cut short (fewer bytes than its
   Content-Length) is the network's fault: ImageUnavailable, never a broken layer.
6. A layer first stored through REGISTRY_AUTH_FILE's credentials records where from
   (``private_to``, its blob). Another repository reuses it only when its registry answers for
   that very blob: a HEAD on the same registry (which enforces its own access), else the blob
   downloaded and checked against the layer. A manifest cannot name its way into another
   tenant's private layer by digest.
7. IMAGE_REWRITES applies first (reference.rewrite): the rewritten reference is the one looked up,
   pulled and tagged; ``PullResult.rewritten_from`` keeps the reference as it was asked for.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import zstandard

from evaluations.images.deadline import PullClock, Stopped
from evaluations.images.errors import ImageError, ImageUnavailable
from evaluations.images.reference import Reference, rewrite
from evaluations.images.registry import INDEX_TYPES, Endpoint, Registry
from evaluations.images.store import ImageRecord, ImageStore, disk_error, hex_of
from evaluations.images.unpack import DigestReader, ImageCaps, decompressed, unpack_layer

MAX_CONFIG_BYTES = 16 * 1024 * 1024
# Layers downloaded and unpacked at the same time: a registry slow per connection (4 layers at 8 MB/s
# each) took 4.05 s one at a time, 2.06 s two at once (issue 38).
LAYERS_AT_ONCE = 2
# os.uname().machine -> (OCI architecture, variant)
_PLATFORMS = {
    "x86_64": ("amd64", None),
    "aarch64": ("arm64", "v8"),
    "armv7l": ("arm", "v7"),
    "armv6l": ("arm", "v6"),
    "i686": ("386", None),
    "ppc64le": ("ppc64le", None),
    "s390x": ("s390x", None),
    "riscv64": ("riscv64", None),
}


@dataclass
class PullResult:
    record: ImageRecord
    cached: bool  # nothing was downloaded: every layer was in the store already
    ref: str = ""  # the reference pulled (IMAGE_REWRITES applied), canonical
    rewritten_from: str | None = None  # the reference asked for, when IMAGE_REWRITES replaced it


def this_platform() -> tuple[str, str | None]:
    machine = os.uname().machine
    return _PLATFORMS.get(machine, (machine, None))


def pull(
    ref_text: str,
    *,
    store: ImageStore,
    config,
    progress: Callable[[str], None] | None = None,
    ssl_context=None,
    cancelled: Callable[[], bool] | None = None,
) -> PullResult:
    """Pull ``ref_text`` into ``store``; ImageError / ImageUnavailable with one sentence on failure.
    ``cancelled``: the evaluation's cancel, asked between chunks and layers (and by the clock's watcher)."""
    rewritten = rewrite(ref_text, config.image_rewrites, config.image_default_registry)
    ref, asked = rewritten.ref, rewritten.rewritten_from
    say = progress or (lambda text: None)
    if asked is not None:
        say(f"image {asked} rewritten to {ref} (IMAGE_REWRITES)")
    known = _from_store(ref, store, config)
    if known is not None:
        store.touch(known.digest)
        store.count("cache_hits")
        return PullResult(store.image(known.digest) or known, cached=True, ref=str(ref), rewritten_from=asked)
    with PullClock.of(str(ref), config, cancelled) as clock, store.using():
        registry = Registry(ref, config, ssl_context=ssl_context, clock=clock)
        digest, manifest, body, endpoint = _manifest(registry, ref)
        config_json = _image_config(registry, endpoint, store, ref, manifest)
        diff_ids = (config_json.get("rootfs") or {}).get("diff_ids") or []
        layers = manifest.get("layers") or []
        if len(diff_ids) != len(layers):
            raise ImageError(f"The image {ref} lists {len(layers)} layers but its config {len(diff_ids)} diff_ids.")
        downloaded = _layers(registry, endpoint, store, layers, diff_ids, say, ImageCaps.of(config))
        store.put_blob(digest, body)
        config = config_json.get("config") or {}
        record = store.save_layers_as_image(digest, config, diff_ids, "pull", [str(ref)])  # evicts as using() ends
    store.count("pulls" if downloaded else "cache_hits")
    return PullResult(record, cached=downloaded == 0, ref=str(ref), rewritten_from=asked)


def _from_store(ref: Reference, store: ImageStore, config) -> ImageRecord | None:
    if ref.digest:
        record = store.image(ref.digest)
        if record is not None:
            return record
        digest = store.resolve_tag(str(ref))  # an index digest, resolved to this platform's manifest
    else:
        digest = store.resolve_tag(str(ref), max_age_secs=config.image_tag_ttl_secs)
    return store.image(digest) if digest else None


def _manifest(registry: Registry, ref: Reference):
    """(digest, manifest, body, endpoint) of the image manifest for this platform."""
    body, media_type, endpoint = registry.manifest(ref.digest or ref.tag)
    digest = sha256_of(body)
    if ref.digest and digest != ref.digest:
        raise ImageError(f"The manifest the registry gave for {ref} has the digest {digest}.")
    manifest = json_object(body, f"The manifest of {ref}")
    media_type = manifest.get("mediaType") or media_type
    if media_type in INDEX_TYPES or "manifests" in manifest:
        chosen = choose_platform(manifest, ref)
        body, _, endpoint = registry.manifest(chosen)
        digest = sha256_of(body)
        if digest != chosen:
            raise ImageError(
                f"The manifest the registry gave for {ref} (platform entry {chosen}) has the digest {digest}."
            )
        manifest = json_object(body, f"The manifest {chosen} of {ref}")
    if "layers" not in manifest or "config" not in manifest:
        raise ImageError(f"The manifest of {ref} is not an image manifest (schema 2 or OCI).")
    return digest, manifest, body, endpoint


def choose_platform(index: dict, ref: Reference) -> str:
    arch, variant = this_platform()
    entries = [entry for entry in index.get("manifests") or [] if isinstance(entry, dict)]
    fits = []
    offered = []
    for entry in entries:
        platform = entry.get("platform") or {}
        name = "/".join(str(platform[key]) for key in ("os", "architecture", "variant") if platform.get(key))
        if name:
            offered.append(name)
        if platform.get("os") == "linux" and platform.get("architecture") == arch:
            if platform.get("variant") in (None, variant):
                fits.append(entry)
    if not fits:
        wanted = f"linux/{arch}" + (f"/{variant}" if variant else "")
        has = ", ".join(dict.fromkeys(offered)) or "no platform"
        raise ImageError(f"There is no manifest for {wanted} in {ref} (has: {has}).")
    digest = str(fits[0].get("digest", ""))
    _check_digest(digest, f"The platform entry of {ref}")
    return digest


def _image_config(registry: Registry, endpoint, store: ImageStore, ref: Reference, manifest: dict) -> dict:
    descriptor = manifest.get("config") or {}
    digest = str(descriptor.get("digest", ""))
    _check_digest(digest, f"The config of {ref}")
    if store.has_blob(digest):
        body = store.blob_path(digest).read_bytes()
    else:
        size = int(descriptor.get("size") or 0)
        if size > MAX_CONFIG_BYTES:
            raise ImageError(f"The config of {ref} is larger than {MAX_CONFIG_BYTES} bytes.")
        with registry.blob(endpoint, digest) as response:
            reader = DigestReader(
                _Network(response, None, digest, registry.clock), limit=MAX_CONFIG_BYTES, what=f"The config of {ref}"
            )
            body = b"".join(iter(lambda: reader.read(1 << 20), b""))
        if reader.digest != digest:
            raise ImageError(f"The config of {ref} does not match its digest {digest} (got {reader.digest}).")
        store.put_blob(digest, body)
    return json_object(body, f"The config of {ref}")


def _layers(
    registry: Registry,
    endpoint: Endpoint,
    store: ImageStore,
    descriptors: list,
    diff_ids: list,
    say,
    caps: ImageCaps,
) -> int:
    """Every layer of the image in the store, LAYERS_AT_ONCE fetched together (module docstring, 3a);
    the bytes downloaded for them."""
    for descriptor, diff_id in zip(descriptors, diff_ids, strict=True):
        _check_layer(registry, descriptor, diff_id)
    firsts: dict[str, int] = {}
    for index, diff_id in enumerate(diff_ids):
        firsts.setdefault(diff_id, index)
    clock = registry.clock

    def fetch(index: int) -> int | None:
        try:
            clock.check()
            return _layer(registry, endpoint, store, descriptors[index], diff_ids[index], caps)
        except BaseException:
            clock.stop()
            raise

    stored = {index: fetch(index) for index in sorted(firsts.values()) if store.has_layer(diff_ids[index])}
    futures: dict[int, Future] = {}
    downloaded = 0
    index = 0
    try:
        with ThreadPoolExecutor(max(1, LAYERS_AT_ONCE), thread_name_prefix="pull-layer") as pool:
            for first in sorted(firsts.values()):
                if first not in stored:
                    futures[first] = pool.submit(fetch, first)
            try:
                for index, descriptor in enumerate(descriptors):
                    if index in stored:
                        got = stored[index]
                    else:  # a repeat: its first is stored by now, it counts again (as one after another would)
                        got = futures[index].result() if index in futures else fetch(index)
                    downloaded += got or 0
                    short = f"{descriptor['digest'][:19]}…"
                    say(f"layer {short} {got / 1e6:.1f} MB pulled" if got is not None else f"layer {short} cached")
            except BaseException:
                clock.stop()
                raise
    except Exception as exc:
        failures = {at: future.exception() for at, future in futures.items() if future.done()}
        failures[index] = failures.get(index) or exc
        own = [failures[at] for at in sorted(failures) if failures[at] and not isinstance(failures[at], Stopped)]
        if own and own[0] is not exc:
            raise own[0] from None
        raise
    return downloaded


def _check_layer(registry: Registry, descriptor, diff_id) -> None:
    """The manifest's descriptor of a layer and the config's diff_id for it are well formed."""
    if not isinstance(descriptor, dict):
        raise ImageError(f"A layer of {registry.ref} is not described by an object in its manifest.")
    digest = str(descriptor.get("digest", ""))
    _check_digest(digest, f"A layer of {registry.ref}")
    _check_digest(str(diff_id), f"A diff_id of {registry.ref}")
    size = descriptor.get("size")
    if not isinstance(size, int) or size < 0:
        raise ImageError(f"Layer {digest} of {registry.ref} has no valid size in its manifest.")


def _layer(
    registry: Registry, endpoint: Endpoint, store: ImageStore, descriptor: dict, diff_id: str, caps: ImageCaps
) -> int | None:
    """Make sure the store has ``diff_id``, within the image's ``caps``; the bytes downloaded for it
    (None: it was there and nothing had to be downloaded to use it)."""
    digest, size = descriptor["digest"], descriptor["size"]
    got = []

    def populate(tree):
        with registry.blob(endpoint, digest) as response, store.new_blob(digest) as keep:
            raw = DigestReader(_Network(response, keep, digest, registry.clock), limit=size, what=f"Layer {digest}")
            counts = unpack_layer(raw, tree, layer=digest, diff_id=diff_id, caps=caps)
            raw.drain()
            if raw.digest != digest or raw.bytes != size:  # inside: the blob is kept only if it matches
                raise ImageError(
                    f"Layer {digest} does not match its manifest: got {raw.bytes} bytes with digest {raw.digest}, "
                    f"expected {size} bytes."
                )
        got.append(raw.bytes)
        return counts.as_meta()

    private = any(candidate.credentials is not None for candidate in registry.endpoints)
    origin = {"private_to": _repository(registry), "blob": digest} if private else None
    if not store.has_layer(diff_id):
        store.add_layer(diff_id, populate, waiting=registry.clock.waiting(), origin=origin)
    if not got:  # stored before (or meanwhile, by another process): it counts as stored
        meta = store.layer_meta(diff_id)
        proved = _may_reuse(registry, endpoint, meta, descriptor, diff_id)
        caps.count_stored(digest, meta)
        got.extend([proved] if proved else [])
    return got[0] if got else None


def _repository(registry: Registry) -> str:
    return f"{registry.ref.registry.lower()}/{registry.ref.repository}"


def _may_reuse(registry: Registry, endpoint: Endpoint, meta: dict, descriptor: dict, diff_id: str) -> int:
    """A stored layer another repository's credentials fetched is used for this one only once this
    registry answers for it: the bytes downloaded to show it (0: a HEAD sufficed, or it is not private).
    ImageError when the registry does not have it."""
    owner = meta.get("private_to")
    if not owner or owner == _repository(registry):
        return 0
    digest = str(descriptor["digest"])
    same_registry = owner.split("/", 1)[0] == registry.ref.registry.lower()
    if same_registry and digest == meta.get("blob"):
        if registry.has_blob(endpoint, digest):
            return 0
        raise ImageError(f"Layer {digest} of {registry.ref} is not in its repository (the registry does not have it).")
    # Another registry could answer a HEAD for anything: it shows the layer by its bytes.
    with registry.blob(endpoint, digest) as response:
        raw = DigestReader(
            _Network(response, None, digest, registry.clock), limit=descriptor["size"], what=f"Layer {digest}"
        )
        try:
            content = DigestReader(decompressed(raw), what=f"Layer {digest}")
            content.drain()
            raw.drain()
        except (OSError, EOFError, ValueError, zlib.error, zstandard.ZstdError) as exc:
            raise ImageError(f"Layer {digest} of {registry.ref} is not a valid compressed stream ({exc}).") from None
    if raw.digest != digest or raw.bytes != descriptor["size"] or content.digest != diff_id:
        raise ImageError(f"Layer {digest} of {registry.ref} does not match its manifest and config.")
    return raw.bytes


class _Network:
    """Reads a blob's response, keeping a copy in ``keep``; a failing connection, a response cut
    short of its Content-Length, or a full disk become ImageUnavailable here, so the unpacker never
    mistakes them for a broken layer. ``clock``: checked at every chunk (cancel, deadline)."""

    def __init__(self, response, keep, digest: str, clock: PullClock):
        self.response, self.keep, self.digest, self.clock = response, keep, digest, clock
        announced = response.getheader("Content-Length")
        self.announced = int(announced) if announced and announced.strip().isdigit() else None
        self.received = 0

    def read(self, size: int = -1) -> bytes:
        self.clock.check()
        try:
            data = self.response.read1(size if size and size > 0 else 1 << 20)
        except TimeoutError:
            self.clock.check()
            raise ImageUnavailable(
                f"Downloading blob {self.digest} stalled: nothing received for {self.clock.stall_secs} s "
                "(IMAGE_FETCH_STALL_SECS)."
            ) from None
        except (OSError, http.client.HTTPException) as exc:  # reset, IncompleteRead, shut by the clock
            self.clock.check()
            raise ImageUnavailable(f"Downloading blob {self.digest} failed ({type(exc).__name__}: {exc}).") from None
        self.received += len(data)
        if not data:
            self.clock.check()  # a connection the clock shut down ends early: say why
        if not data and self.announced is not None and self.received < self.announced:
            raise ImageUnavailable(
                f"Downloading blob {self.digest} was cut short: {self.received} of {self.announced} bytes arrived."
            )
        if self.keep is not None and data:
            try:
                self.keep.write(data)
            except OSError as exc:
                raise disk_error(exc, f"storing blob {self.digest}") from None
        return data


def _check_digest(digest: str, what: str) -> None:
    try:
        hex_of(digest)
    except ValueError:
        raise ImageError(f"{what} has the digest {digest[:80]!r}, not sha256:<64 hex>.") from None


def sha256_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def json_object(body: bytes, what: str) -> dict:
    """``body`` as a JSON object; ImageError saying ``what`` is not one (pulls and archives alike)."""
    try:
        value = json.loads(body)
    except ValueError:
        raise ImageError(f"{what} is not valid JSON.") from None
    if not isinstance(value, dict):
        raise ImageError(f"{what} is not a JSON object.")
    return value
