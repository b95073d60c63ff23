"""A client of the OCI distribution API (``/v2/``): manifests, blobs, token and basic auth, mirrors.

Ours, in Python, rather than skopeo: every connection goes through the URL guard, as the
executor's other fetches do (evaluations/network/urlguard.py). The registry's name is resolved
once, every address checked (a registry on a private address is reached only when
``ALLOWED_PRIVATE_HOSTS`` or ``ALLOW_PRIVATE_URLS`` allows it), and the connection pinned to a
checked address; every redirect (blob CDNs, token realms) is checked again from the start.
skopeo would resolve and follow on its own. Blobs are handed to the caller as a stream, so the
puller verifies and unpacks them as they arrive, with nothing staged.

Credentials (REGISTRY_AUTH_FILE) go only where they belong (SPEC §21): to the registry's own
host, never to another host a redirect names, never after an https-to-http redirect; to a token
realm only when it is on the registry's host (Docker Hub's is auth.docker.io) over as safe a
scheme, else the realm gets the auth file's own entry for its host, or is asked anonymously.

Every connection is bounded by the pull's clock (images/deadline.py): its socket timeout is at
most what is left of IMAGE_PULL_TIMEOUT_SECS (a blob's at most IMAGE_FETCH_STALL_SECS), and the
clock's watcher shuts it down when the pull is cancelled or out of time.

Errors are ImageError (the reference is wrong: 404, no such repository, malformed answers) or
ImageUnavailable (unreachable, 5xx, timeouts, credentials the operator gave refused).
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import ssl
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode, urljoin, urlsplit

from evaluations.images.deadline import PullClock
from evaluations.images.errors import ImageError, ImageUnavailable
from evaluations.images.reference import DOCKER_HUB, Reference
from evaluations.network.urlguard import FetchError, URLPolicy, URLRefused, pinned_connection, verifying_context

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
INDEX_TYPES = MANIFEST_TYPES[:2]
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
_REDIRECTS = {301, 302, 303, 307, 308}
_MAX_REDIRECTS = 5
_CHALLENGE_PARAM = re.compile(r'(\w+)=(?:"([^"]*)"|([^,\s]*))')
# A registry whose token realm is on another host of its own: Docker Hub's API and its token service.
_REALM_HOSTS = {DOCKER_HUB: "auth.docker.io"}


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


def load_credentials(auth_file: Path | None, registry: str, repository: str = "") -> Credentials | None:
    """Credentials for ``registry`` (and ``repository``) from a containers ``auth.json`` or a Docker
    ``config.json``: the ``auths`` entry that names the longest prefix of ``registry/repository``."""
    if auth_file is None:
        return None
    try:
        auths = json.loads(Path(auth_file).read_text()).get("auths") or {}
    except (OSError, ValueError, AttributeError) as exc:
        raise ImageUnavailable(f"REGISTRY_AUTH_FILE {auth_file} cannot be read ({exc}).") from None
    wanted = f"{_hub_alias(registry)}/{repository}".rstrip("/")
    best: tuple[int, dict] | None = None
    for key, entry in auths.items():
        name = re.sub(r"^[a-z]+://", "", key.strip().lower()).rstrip("/")
        host, _, path = name.partition("/")
        name = _hub_alias(host) + (
            "/" + path if path and not path.startswith("v1") and not path.startswith("v2") else ""
        )
        if (wanted == name or wanted.startswith(name + "/")) and (best is None or len(name) > best[0]):
            best = (len(name), entry if isinstance(entry, dict) else {})
    if best is None:
        return None
    entry = best[1]
    if entry.get("auth"):
        try:
            username, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
        except ValueError:
            raise ImageUnavailable(
                f"REGISTRY_AUTH_FILE: the 'auth' of {registry} is not base64 user:password."
            ) from None
        return Credentials(username, password)
    if entry.get("username"):
        return Credentials(entry["username"], entry.get("password", ""))
    return None


def _hub_alias(host: str) -> str:
    return DOCKER_HUB if host in ("index.docker.io", "registry-1.docker.io", "docker.io") else host


@dataclass
class Endpoint:
    """One place to ask for a repository: the registry itself or one of its mirrors."""

    host: str  # host[:port] as configured
    scheme: str
    credentials: Credentials | None

    @property
    def base(self) -> str:
        api_host = "registry-1.docker.io" if self.host == DOCKER_HUB else self.host
        return f"{self.scheme}://{api_host}"

    @property
    def hostname(self) -> str:
        return urlsplit(self.base).hostname or ""


class Registry:
    """The endpoints serving one reference's repository, tried in order (mirrors first)."""

    def __init__(
        self, ref: Reference, config, *, ssl_context: ssl.SSLContext | None = None, clock: PullClock | None = None
    ):
        self.ref = ref
        self.policy = URLPolicy(("http", "https"), config.allow_private_urls, tuple(config.allowed_private_hosts))
        self.timeout = float(config.download_timeout_secs)
        self.clock = clock or PullClock.of(str(ref), config)
        self.auth_file = config.registry_auth_file
        if ssl_context is None:
            cafile = str(config.ca_bundle) if getattr(config, "ca_bundle", None) else None
            ssl_context = verifying_context(cafile)
        self.ssl_context = ssl_context
        insecure = set(config.image_insecure_registries)  # lower case, as the mirrors' keys
        hosts = [*config.registry_mirrors.get(ref.registry.lower(), ()), ref.registry.lower()]
        self.endpoints = [
            Endpoint(
                host,
                "http" if host in insecure else "https",
                load_credentials(config.registry_auth_file, host, ref.repository),
            )
            for host in hosts
        ]
        self._tokens: dict[str, str] = {}  # endpoint base -> bearer token

    # -- what the puller asks ---------------------------------------------------------------

    def manifest(self, reference: str) -> tuple[bytes, str, Endpoint]:
        """The manifest (or index) named by a tag or digest, its media type, and who served it."""
        last: ImageError | None = None
        for endpoint in self.endpoints:
            try:
                with self._get(endpoint, f"manifests/{reference}", accept=", ".join(MANIFEST_TYPES)) as response:
                    body = _read_capped(response, MAX_MANIFEST_BYTES, f"The manifest of {self.ref}")
                    media_type = (response.getheader("Content-Type") or "").split(";")[0].strip()
                return body, media_type, endpoint
            except ImageError as exc:
                last = exc  # a mirror that lacks it or is down: the next one, then the registry
        assert last is not None
        raise last

    def has_blob(self, endpoint: Endpoint, digest: str) -> bool:
        """Whether ``endpoint`` answers for the blob ``digest`` in this repository (HEAD: 200), as this
        pull's credentials see it. Errors other than its plain "no" (404, 401, 403) raise."""
        try:
            with self._get(endpoint, f"blobs/{digest}", accept="*/*", method="HEAD"):
                return True
        except ImageUnavailable:
            raise
        except ImageError:
            return False

    @contextmanager
    def blob(self, endpoint: Endpoint, digest: str) -> Iterator[http.client.HTTPResponse]:
        """A response streaming the blob ``digest`` (the caller verifies it), from ``endpoint``
        when it has it, else from the others in order."""
        order = [endpoint, *(other for other in self.endpoints if other is not endpoint)]
        with ExitStack() as stack:
            errors: list[ImageError] = []
            for candidate in order:
                try:
                    response = stack.enter_context(self._get(candidate, f"blobs/{digest}", accept="*/*"))
                    break
                except ImageError as exc:
                    errors.append(exc)
            else:
                raise errors[-1]
            yield response

    # -- HTTP -------------------------------------------------------------------------------

    @contextmanager
    def _get(
        self, endpoint: Endpoint, path: str, *, accept: str, method: str = "GET"
    ) -> Iterator[http.client.HTTPResponse]:
        url = f"{endpoint.base}/v2/{self.ref.repository}/{path}"
        kind, _, name = path.partition("/")
        what = f"{kind[:-1]} {name} of {self.ref.repository}"
        # A blob's bytes may take long; each read may not: IMAGE_FETCH_STALL_SECS.
        wait = float(self.clock.stall_secs) if kind == "blobs" else self.timeout
        for attempt in range(2):
            auth = self._authorization(endpoint)
            conn, response = self._follow(url, {"Accept": accept, **auth}, endpoint, what, wait=wait, method=method)
            try:
                if response.status == 401 and attempt == 0:
                    challenge = response.getheader("WWW-Authenticate") or ""
                    response.read()
                    self._authenticate(endpoint, challenge, what)
                    continue
                self._check_status(response, endpoint, what)
                yield response
                return
            finally:
                self._close(conn)

    def _follow(self, url: str, headers: dict, endpoint: Endpoint, what: str, *, wait: float, method: str = "GET"):
        """``method`` ``url``, following redirects by hand: each hop checked by the URL guard again,
        and the Authorization never sent to another host nor after an https-to-http redirect."""
        first_host = None
        secure = None  # the scheme of every hop so far was https
        for _hop in range(_MAX_REDIRECTS + 1):
            self.clock.check()
            resolved = self._check(url, what)
            first_host = first_host or resolved.host
            secure = resolved.scheme == "https" if secure is None else secure
            downgraded = secure and resolved.scheme != "https"
            if resolved.host != first_host or downgraded:
                headers = {k: v for k, v in headers.items() if k != "Authorization"}  # and at every later hop
            conn = pinned_connection(
                resolved, timeout_secs=self.clock.socket_timeout(wait), ssl_context=self.ssl_context
            )
            try:
                conn.request(method, resolved.target, headers={"User-Agent": "term-executor", **headers})
                self.clock.watch(conn)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                self._close(conn)
                self.clock.check()  # cancelled or out of time: say that, not "unreachable"
                raise ImageUnavailable(
                    f"The registry {endpoint.host} cannot be reached for the {what} ({_describe(exc)})."
                ) from None
            if response.status not in _REDIRECTS:
                return conn, response
            location = response.getheader("Location")
            response.read()
            self._close(conn)
            if not location:
                raise ImageUnavailable(f"The registry {endpoint.host} redirected the {what} nowhere.")
            url = urljoin(url, location)
        raise ImageUnavailable(f"The registry {endpoint.host} redirected the {what} more than {_MAX_REDIRECTS} times.")

    def _close(self, conn: http.client.HTTPConnection) -> None:
        self.clock.unwatch(conn)
        conn.close()

    def _check(self, url: str, what: str):
        try:
            return self.policy.check(url, label="registry")
        except URLRefused as exc:
            if exc.transient:
                raise ImageUnavailable(f"The {what} cannot be fetched: {exc}.") from None
            raise ImageError(f"The {what} cannot be fetched: {exc}.") from None

    def _check_status(self, response: http.client.HTTPResponse, endpoint: Endpoint, what: str) -> None:
        status = response.status
        if status == 200:
            return
        detail = _error_detail(response)
        if status == 404:
            raise ImageError(f"The registry {endpoint.host} has no {what}{detail}.")
        if status in (401, 403):
            if endpoint.credentials is not None:
                raise ImageUnavailable(
                    f"The registry {endpoint.host} refused the credentials of REGISTRY_AUTH_FILE for the {what}{detail}."
                )
            raise ImageError(
                f"The registry {endpoint.host} refused the {what}: it does not exist or needs credentials{detail}."
            )
        if status >= 500 or status in (408, 425, 429):
            raise ImageUnavailable(f"The registry {endpoint.host} answered HTTP {status} for the {what}{detail}.")
        raise ImageError(f"The registry {endpoint.host} answered HTTP {status} for the {what}{detail}.")

    # -- auth -------------------------------------------------------------------------------

    def _authorization(self, endpoint: Endpoint) -> dict:
        token = self._tokens.get(endpoint.base)
        if token == "basic" and endpoint.credentials:
            return {"Authorization": endpoint.credentials.basic()}
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _authenticate(self, endpoint: Endpoint, challenge: str, what: str) -> None:
        """Answer a 401's ``WWW-Authenticate``: Basic with the operator's credentials, or a Bearer
        token from the realm (anonymous, or with the credentials)."""
        scheme, _, params_text = challenge.strip().partition(" ")
        params = {key.lower(): quoted or bare for key, quoted, bare in _CHALLENGE_PARAM.findall(params_text)}
        if scheme.lower() == "basic":
            if endpoint.credentials is None:
                raise ImageError(
                    f"The registry {endpoint.host} needs credentials for the {what}, and REGISTRY_AUTH_FILE has none."
                )
            self._tokens[endpoint.base] = "basic"
            return
        if scheme.lower() != "bearer" or not params.get("realm"):
            raise ImageUnavailable(
                f"The registry {endpoint.host} asks for an authentication we do not speak ({challenge[:80]!r})."
            )
        query = {"scope": params.get("scope") or f"repository:{self.ref.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        realm = params["realm"] + ("&" if "?" in params["realm"] else "?") + urlencode(query)
        headers = {"Accept": "application/json"}
        credentials = self._realm_credentials(endpoint, realm)
        if credentials is not None:
            headers["Authorization"] = credentials.basic()
        conn, response = self._follow(realm, headers, endpoint, f"token for the {what}", wait=self.timeout)
        try:
            if response.status in (401, 403) and credentials is not None:
                raise ImageUnavailable(f"The registry {endpoint.host} refused the credentials of REGISTRY_AUTH_FILE.")
            self._check_status(response, endpoint, f"token for the {what}")
            try:
                answer = json.loads(_read_capped(response, 1 << 20, f"The token of {endpoint.host}"))
                token = answer.get("token") or answer.get("access_token")
            except (ValueError, AttributeError):
                token = None
            if not token:
                raise ImageUnavailable(f"The registry {endpoint.host} answered no token for the {what}.")
            self._tokens[endpoint.base] = token
        finally:
            self._close(conn)

    def _realm_credentials(self, endpoint: Endpoint, realm: str) -> Credentials | None:
        """The credentials a token realm may see: the registry's when the realm is on the registry's
        own host (or the one host Docker Hub's tokens come from), over https if the registry is; else
        the auth file's entry for the realm's own host, if any; else none (an anonymous token)."""
        parts = urlsplit(realm)
        host = (parts.hostname or "").lower()
        if not host or (endpoint.scheme == "https" and parts.scheme != "https"):
            return None
        if host in (endpoint.hostname, _REALM_HOSTS.get(endpoint.host)):
            return endpoint.credentials
        try:
            netloc = host if parts.port is None else f"{host}:{parts.port}"
        except ValueError:
            return None
        return load_credentials(self.auth_file, netloc)


def _read_capped(response: http.client.HTTPResponse, limit: int, what: str) -> bytes:
    try:
        body = response.read(limit + 1)
    except (OSError, http.client.HTTPException) as exc:
        raise ImageUnavailable(f"{what} could not be read ({_describe(exc)}).") from None
    if len(body) > limit:
        raise ImageError(f"{what} is larger than {limit} bytes.")
    return body


def _error_detail(response: http.client.HTTPResponse) -> str:
    """The registry's own error code (MANIFEST_UNKNOWN, NAME_UNKNOWN, ...), when it gives one."""
    try:
        errors = json.loads(response.read(65536) or b"{}").get("errors") or []
        codes = ", ".join(str(error.get("code")) for error in errors if isinstance(error, dict) and error.get("code"))
    except (ValueError, AttributeError, OSError, http.client.HTTPException):
        return ""
    return f" ({codes})" if codes else ""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, FetchError):
        return str(exc)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed: {exc.verify_message}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)[:200] or type(exc).__name__
