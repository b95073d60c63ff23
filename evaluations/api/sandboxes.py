"""Live sandboxes over HTTP (SPEC §24): create, exec, files, network, read, list, delete.

1. POST /sandboxes checks the body (sandboxes/spec.py), keeps an uploaded build context where the
   sandbox's process finds it, writes the row (``starting``, this host's node), wakes the worker,
   and waits up to SANDBOX_CREATE_WAIT_SECS for the sandbox to be ready: 201, else 202 (a pull or a
   build under way; GET shows the rest). One that failed meanwhile answers its error envelope.
2. Every other route reads the row first (another tenant's is 404, as a missing one). A sandbox
   made on another host of the fleet is answered there: 307 to its host's PUBLIC_URL, same path;
   a stopped, expired or failed one stays readable, and exec, files and network on it are 410.
3. On its own host, a request goes to the sandbox's process over its control socket
   (sandboxes/control.py); what the process answers is the response, bytes streamed through.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from evaluations import lifecycle
from evaluations.api.errors import ApiError
from evaluations.api.openapi import UNAUTHORIZED, error
from evaluations.api.parsers import BoundedJSONParser
from evaluations.models import LIVE_SANDBOX_STATUSES, Sandbox, SandboxStatus
from evaluations.representation import Shape, iso, shown
from evaluations.sandboxes import control, files, fleet, host
from evaluations.sandboxes.spec import SpecError, parse
from evaluations.worker import wakeup

TAG_SANDBOXES = "sandboxes"
_RECHECK_SECS = 1.0  # the row read again while no wake-up came (a lost datagram costs at most this)
_CHUNK = 1 << 16

SANDBOX_ID = OpenApiParameter("sandbox_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The sandbox's id.")
PATH = OpenApiParameter(
    "path", str, OpenApiParameter.QUERY, required=True, description="An absolute path in the sandbox."
)
SERVICE = OpenApiParameter(
    "service", str, OpenApiParameter.QUERY, description="A compose service's name (absent or main: main)."
)
EXTRACT = OpenApiParameter(
    "extract", str, OpenApiParameter.QUERY, enum=["tar"], description="Unpack a tar body under path."
)
NO_SANDBOX = error("No such sandbox, or another tenant's", "not_found")
GONE = error("The sandbox has ended", "gone")
BAD = error("A malformed request", "bad_request", "invalid_json")
STARTING = error("The sandbox is still starting", "starting")
REDIRECT = OpenApiResponse(description="The sandbox lives on another host: the same request at its PUBLIC_URL")
# What a request to a live sandbox may answer besides its own success.
LIVE_ANSWERS = {307: REDIRECT, 400: BAD, 401: UNAUTHORIZED, 404: NO_SANDBOX, 409: STARTING, 410: GONE}


class NetworkSerializer(serializers.Serializer):
    mode = serializers.ChoiceField(choices=["public", "no-network", "allowlist"])
    allowed_hosts = serializers.ListField(child=serializers.CharField(), required=False)


class SandboxServiceSerializer(serializers.Serializer):
    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=["image", "dockerfile"])
    ref = serializers.CharField()
    digest = serializers.CharField()
    cached = serializers.BooleanField()
    state = serializers.ChoiceField(
        choices=["starting", "running", "exited", "stopped"],
        help_text="exited: its first process ended (exit_code), its sandbox still answers; stopped: stopped alone "
        "(POST .../services/{name}/stop: its files still answer, exec does not) or the sandbox ended",
    )
    exit_code = serializers.IntegerField(required=False)


class SandboxEnvironmentSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["image", "dockerfile", "task_url"])
    ref = serializers.CharField()
    digest = serializers.CharField()
    cached = serializers.BooleanField()
    state = serializers.ChoiceField(
        choices=["stopped"], required=False, help_text="main's, once stopped alone (POST .../services/main/stop)"
    )
    services = SandboxServiceSerializer(
        many=True, required=False, help_text="The compose file's services besides main (SPEC §23-24)"
    )


def _environment(row: Sandbox) -> dict | None:
    """The row's ``environment``; once the sandbox has ended, each of its services ``stopped``."""
    environment = row.environment
    if not environment or not environment.get("services") or row.status in LIVE_SANDBOX_STATUSES:
        return environment
    return {**environment, "services": [{**service, "state": "stopped"} for service in environment["services"]]}


class SandboxSerializer(Shape):
    sandbox_id = shown(serializers.UUIDField(), lambda row: str(row.id))
    status = serializers.ChoiceField(choices=SandboxStatus.choices)
    environment = shown(SandboxEnvironmentSerializer(allow_null=True), _environment)
    network = shown(NetworkSerializer(allow_null=True), lambda row: row.network or row.spec.get("network"))
    error = shown(serializers.CharField(allow_null=True), lambda row: row.error or None)
    error_kind = serializers.CharField(allow_null=True)
    created_at = shown(serializers.DateTimeField(), lambda row: iso(row.created_at))
    ready_at = shown(serializers.DateTimeField(allow_null=True), lambda row: iso(row.ready_at))
    expires_at = shown(serializers.DateTimeField(allow_null=True), lambda row: iso(row.expires_at))
    ended_at = shown(serializers.DateTimeField(allow_null=True), lambda row: iso(row.ended_at))
    last_active_at = shown(serializers.DateTimeField(), lambda row: iso(row.last_active_at))
    idle_timeout_secs = serializers.IntegerField()
    max_lifetime_secs = serializers.IntegerField()
    exec_count = serializers.IntegerField()
    owner = serializers.CharField(allow_null=True)


class CreateSerializer(serializers.Serializer):
    environment = serializers.DictField(
        help_text="{image: REF} | {dockerfile: PATH} (in the context) | {task_url: URL}; "
        "compose: docker-compose.yaml (at the context's top) beside image or dockerfile"
    )
    cpus = serializers.FloatField(required=False)
    memory_mb = serializers.IntegerField(required=False)
    storage_mb = serializers.IntegerField(required=False)
    network = NetworkSerializer(required=False)
    env = serializers.DictField(child=serializers.CharField(), required=False)
    workdir = serializers.CharField(required=False)
    user = serializers.CharField(required=False)
    idle_timeout_secs = serializers.IntegerField(required=False)
    max_lifetime_secs = serializers.IntegerField(required=False)


class ExecSerializer(serializers.Serializer):
    command = serializers.JSONField(help_text='"a string for sh -c" or ["argv", ...]')
    cwd = serializers.CharField(required=False)
    env = serializers.DictField(child=serializers.CharField(), required=False)
    timeout_secs = serializers.FloatField(required=False)
    user = serializers.JSONField(required=False, help_text="a user name or a uid")
    service = serializers.CharField(required=False, help_text="a compose service's name (absent or main: main)")


class ExecResultSerializer(serializers.Serializer):
    exit_code = serializers.IntegerField()
    stdout = serializers.CharField()
    stderr = serializers.CharField()
    timed_out = serializers.BooleanField()
    truncated = serializers.BooleanField()
    oom_killed = serializers.BooleanField()
    duration_ms = serializers.IntegerField()


def _config():
    return settings.EXECUTOR


def _row(sandbox_id: str, caller) -> Sandbox:
    try:
        pk = uuid.UUID(str(sandbox_id))
    except ValueError:
        raise ApiError(404, "not_found", f"no sandbox {sandbox_id}") from None
    row = caller.visible(Sandbox.objects).filter(id=pk, pooled=False).first()
    if row is None:
        raise ApiError(404, "not_found", f"no sandbox {sandbox_id}")
    return row


def here(row: Sandbox) -> bool:
    """The sandbox lives on this host: only its host reaches its process."""
    return row.node == fleet.node(_config())


class NotHere(Exception):
    """The sandbox lives on another host of the fleet: stop it there (DELETE there, or its admin)."""


def stop(row: Sandbox) -> bool:
    """Stop a sandbox of this host, for DELETE /sandboxes/{id} and the admin's action: every process,
    its files, its uid and mounts given back. False when the row says it had already ended;
    NotHere for another host's.

    1. A starting one is marked stopped: its process sees that once its environment is ready, and
       tears down.
    2. A ready one's process is asked to stop, and answers once it has given everything back (its
       teardown writes ``stopped``).
    3. No process answers (it died): marked stopped here; the reaper removes what it left.
    """
    if row.status not in LIVE_SANDBOX_STATUSES:
        return False
    if not here(row):
        raise NotHere(f"sandbox {row.id} lives on {row.public_url or row.node}")
    if row.status == SandboxStatus.STARTING and lifecycle.end_sandbox(row.id, SandboxStatus.STOPPED):
        return True
    try:
        control.call(_config().data_dir, str(row.id), {"op": "stop"}, timeout=180)
    except control.OwnerUnreachable:
        lifecycle.end_sandbox(row.id, SandboxStatus.STOPPED)
    return True


def _owned_here(request, row: Sandbox, *, live: bool = True) -> None:
    """Raise what answers a request that this host cannot serve: 410 for an ended sandbox (when
    ``live``), 307 to the host that runs it."""
    if live and row.status not in LIVE_SANDBOX_STATUSES:
        raise ApiError(410, "gone", f"sandbox {row.id} is {row.status}")
    if here(row):
        return
    if not row.public_url:
        raise ApiError(503, "infrastructure", f"sandbox {row.id} lives on {row.node}, which has no PUBLIC_URL")
    location = fleet.redirect_url(row.public_url, request.get_full_path())
    raise ApiError(307, "moved", f"sandbox {row.id} lives on {row.public_url}", headers={"Location": location})


def _live_row(request, sandbox_id: str) -> Sandbox:
    """The sandbox an exec, a file or a network request goes to: the caller's, live, on this host, ready."""
    row = _row(sandbox_id, request.user)
    _owned_here(request, row)
    if row.status == SandboxStatus.STARTING:
        raise ApiError(409, "starting", f"sandbox {row.id} is still starting: GET it until it is ready")
    return row


def _owner_error(answer: dict) -> ApiError:
    return ApiError(answer["status"], answer.get("error", "internal_error"), answer.get("detail", "the sandbox failed"))


def _connect(request, sandbox_id: str, timeout: float | None) -> control.Connection:
    """A connection to the process that runs the sandbox, when it runs on this host: no database
    read on the way (an exec's round trip is what harnesses wait on); the process checks that the
    caller's tenant is its owner, and answers another's request as not found. Else what the row
    says: 404, 307 to the sandbox's host, 409 starting, 410 gone."""
    try:
        pk = uuid.UUID(str(sandbox_id))
    except ValueError:
        raise ApiError(404, "not_found", f"no sandbox {sandbox_id}") from None
    try:
        return control.Connection(_config().data_dir, str(pk), timeout)
    except control.OwnerUnreachable:
        pass
    row = _live_row(request, sandbox_id)
    raise ApiError(410, "gone", f"sandbox {row.id} has ended")  # live here by its row, and nothing answers


def _ask(request, sandbox_id: str, header: dict, *, body=None, length: int = 0, timeout=None) -> tuple:
    """One request to the sandbox's process: (its answer, the open connection, for a body to read)."""
    conn = _connect(request, sandbox_id, timeout)
    try:
        conn.send({**header, "caller": request.user.owner}, body, length)
        answer = conn.answer()
    except (OSError, control.OwnerUnreachable):
        conn.close()
        raise ApiError(410, "gone", f"sandbox {sandbox_id} has ended") from None
    if answer.get("status", 500) >= 300:
        conn.close()
        raise _owner_error(answer)
    return answer, conn


def _call(request, sandbox_id: str, header: dict, **kwargs) -> dict:
    answer, conn = _ask(request, sandbox_id, header, **kwargs)
    conn.close()
    return answer


class SandboxListView(APIView):
    parser_classes = [MultiPartParser, BoundedJSONParser]

    @extend_schema(
        tags=[TAG_SANDBOXES],
        summary="Make a live sandbox",
        description="JSON, or multipart/form-data with a `spec` part (that JSON) and a `context` part "
        "(a tar, gzip allowed, of a build context). 201 once ready within SANDBOX_CREATE_WAIT_SECS, "
        "else 202 `starting`.",
        request=CreateSerializer,
        responses={
            201: SandboxSerializer,
            202: SandboxSerializer,
            400: error(
                "A bad body, or the sandbox failed for its image's or its request's sake",
                "bad_request",
                "invalid_json",
                "task_invalid",
            ),
            401: UNAUTHORIZED,
            413: error("The build context is too large", "payload_too_large"),
            503: error(
                "At capacity (MAX_SANDBOXES), or it failed for the host's sake", "at_capacity", "infrastructure"
            ),
        },
    )
    def post(self, request):
        config = _config()
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        if length > config.max_context_bytes + 1024 * 1024:
            raise ApiError(
                413, "payload_too_large", f"the request is larger than MAX_CONTEXT_BYTES ({config.max_context_bytes})"
            )
        body, context = _create_body(request)
        try:
            spec = parse(body, has_context=context is not None)
        except SpecError as exc:
            raise ApiError(400, "bad_request", str(exc), fields={exc.field: [exc.sentence]}) from None
        node = fleet.node(config)
        if (adopted := _adopt_warm(request, config, spec, node)) is not None:
            return Response(
                SandboxSerializer.build(adopted), status=201, headers={"Location": f"/sandboxes/{adopted.id}"}
            )
        if Sandbox.objects.filter(node=node, status__in=LIVE_SANDBOX_STATUSES).count() >= config.max_sandboxes:
            raise ApiError(
                503,
                "at_capacity",
                f"this host runs MAX_SANDBOXES={config.max_sandboxes} sandboxes",
                headers={"Retry-After": "5"},
            )
        sandbox_id = uuid.uuid4()
        if context is not None:
            _keep_context(config, str(sandbox_id), context)
        with control.ready_listener(config.data_dir, str(sandbox_id)) as ready:  # bound before the row exists
            row = lifecycle.start_sandbox(
                id=sandbox_id,
                owner=request.user.owner,
                spec=spec.as_dict(),
                network=spec.network.as_dict(),
                node=node,
                public_url=config.public_url,
                idle_timeout_secs=spec.idle_timeout_secs,
                max_lifetime_secs=spec.max_lifetime_secs,
            )
            wakeup.notify(config.data_dir)
            row = _wait_ready(row, config.sandbox_create_wait_secs, ready)
        if row.status == SandboxStatus.FAILED:
            status = 400 if row.error_kind == "task_invalid" else 503
            raise ApiError(status, row.error_kind or "infrastructure", f"sandbox {row.id} failed: {row.error}")
        code = 201 if row.status == SandboxStatus.READY else 202
        return Response(SandboxSerializer.build(row), status=code, headers={"Location": f"/sandboxes/{row.id}"})

    @extend_schema(
        tags=[TAG_SANDBOXES],
        summary="The caller's sandboxes (operators: all), newest first",
        parameters=[OpenApiParameter("status", str, OpenApiParameter.QUERY, enum=SandboxStatus.values)],
        responses={
            200: SandboxSerializer(many=True),
            400: error("An unknown status", "bad_request"),
            401: UNAUTHORIZED,
        },
    )
    def get(self, request):
        rows = request.user.visible(Sandbox.objects).filter(pooled=False).order_by("-created_at")
        wanted = request.query_params.get("status")
        if wanted:
            if wanted not in SandboxStatus.values:
                raise ApiError(400, "bad_request", f"status: expected one of {', '.join(SandboxStatus.values)}")
            rows = rows.filter(status=wanted)
        return Response([SandboxSerializer.build(row) for row in rows[:1000]])


def _adopt_warm(request, config, spec, node: str) -> Sandbox | None:
    """A warm sandbox of the image asked for (SANDBOX_WARM_IMAGES), taken for this request: its row
    the request's (owner, spec, times) in one conditional update, then its process told (it applies
    the user, workdir, env and network). None when there is none to take, or the spec asks for
    what a warm one was not made with (a Dockerfile, a task, its own memory or storage)."""
    if spec.kind != "image" or spec.ref not in config.sandbox_warm_images or spec.memory_mb or spec.storage_mb:
        return None
    warm = Sandbox.objects.filter(node=node, pooled=True, pool_key=spec.ref, status=SandboxStatus.READY)
    for candidate in warm.values_list("id", flat=True)[:3]:
        now = timezone.now()
        if not lifecycle.adopt_sandbox(
            candidate,
            owner=request.user.owner,
            spec=spec.as_dict(),
            network=spec.network.as_dict(),
            idle_timeout_secs=spec.idle_timeout_secs,
            max_lifetime_secs=spec.max_lifetime_secs,
            created_at=now,
            ready_at=now,
            last_active_at=now,
            expires_at=now + timedelta(seconds=spec.max_lifetime_secs),
        ):
            continue  # another request took it
        wakeup.notify(config.data_dir)  # the worker makes the next warm one
        header = {"op": "adopt", "spec": spec.as_dict(), "owner": request.user.owner}
        try:
            answer = control.call(config.data_dir, str(candidate), header, timeout=60)
        except control.OwnerUnreachable:
            lifecycle.end_sandbox(
                candidate, SandboxStatus.FAILED, error="its process did not answer", kind="infrastructure"
            )
            continue
        if answer.get("status") != 200:
            lifecycle.end_sandbox(candidate, SandboxStatus.FAILED, error=answer.get("detail", ""), kind="task_invalid")
            raise _owner_error(answer)
        return Sandbox.objects.get(id=candidate)
    return None


def _create_body(request):
    """(the spec's JSON, the uploaded context file or None)."""
    content_type = request.content_type or ""
    if not content_type.startswith("multipart/form-data"):
        return request.data, None
    spec_text = request.data.get("spec")
    if spec_text is None:
        raise ApiError(400, "bad_request", "multipart: a spec part (the JSON) is needed")
    if hasattr(spec_text, "read"):
        spec_text = spec_text.read().decode("utf-8", "replace")
    try:
        body = json.loads(spec_text)
    except ValueError as exc:
        raise ApiError(400, "invalid_json", f"spec: not JSON ({exc})") from None
    context = request.data.get("context")
    if context is None or not hasattr(context, "read"):
        raise ApiError(400, "bad_request", "multipart: a context part (a tar of the build context) is needed")
    if context.size > _config().max_context_bytes:
        raise ApiError(
            413,
            "payload_too_large",
            f"the build context is larger than MAX_CONTEXT_BYTES ({_config().max_context_bytes})",
        )
    return body, context


def _keep_context(config, sandbox_id: str, context) -> None:
    target = host.context_path(config, sandbox_id)
    target.parent.mkdir(mode=0o700, exist_ok=True)
    with open(target, "wb") as out:
        for chunk in context.chunks():
            out.write(chunk)


def _wait_ready(row: Sandbox, wait_secs: float, ready) -> Sandbox:
    """The row once the sandbox is ready or failed, or as it is after ``wait_secs``: woken by the
    sandbox's process (``ready``, control.announce_ready), the row read again at least each second."""
    deadline = time.monotonic() + wait_secs
    while row.status == SandboxStatus.STARTING and (left := deadline - time.monotonic()) > 0:
        ready.settimeout(min(left, _RECHECK_SECS))
        try:
            ready.recv(16)
        except TimeoutError:
            pass
        row.refresh_from_db()
    return row


class SandboxDetailView(APIView):
    @extend_schema(
        tags=[TAG_SANDBOXES],
        summary="One sandbox",
        parameters=[SANDBOX_ID],
        responses={200: SandboxSerializer, 401: UNAUTHORIZED, 404: NO_SANDBOX},
    )
    def get(self, request, sandbox_id):
        return Response(SandboxSerializer.build(_row(sandbox_id, request.user)))

    @extend_schema(
        tags=[TAG_SANDBOXES],
        summary="Stop a sandbox: every process, its files, its uid and mounts given back",
        parameters=[SANDBOX_ID],
        responses={204: None, 307: REDIRECT, 401: UNAUTHORIZED, 404: NO_SANDBOX},
    )
    def delete(self, request, sandbox_id):
        row = _row(sandbox_id, request.user)
        if row.status not in LIVE_SANDBOX_STATUSES:
            return HttpResponse(status=204)
        _owned_here(request, row)
        stop(row)
        return HttpResponse(status=204)


class SandboxExecView(APIView):
    @extend_schema(
        tags=[TAG_SANDBOXES],
        summary="Run a command in the sandbox",
        parameters=[SANDBOX_ID],
        request=ExecSerializer,
        responses={
            200: ExecResultSerializer,
            **LIVE_ANSWERS,
            409: error("Still starting, or the service is stopped", "starting", "service_stopped"),
        },
    )
    def post(self, request, sandbox_id):
        data = request.data
        keys = ("command", "cwd", "env", "timeout_secs", "user", "service")
        header = {"op": "exec", **{key: data.get(key) for key in keys}}
        answer = _call(request, sandbox_id, header)
        answer.pop("status", None)
        return Response(answer)


class SandboxNetworkView(APIView):
    @extend_schema(
        tags=[TAG_SANDBOXES],
        summary="Change the sandbox's egress policy for later connections",
        parameters=[SANDBOX_ID],
        request=NetworkSerializer,
        responses={200: NetworkSerializer, **LIVE_ANSWERS},
    )
    def put(self, request, sandbox_id):
        answer = _call(request, sandbox_id, {"op": "network", "network": request.data})
        return Response(answer["network"])


class SandboxServiceStopView(APIView):
    @extend_schema(
        tags=[TAG_SANDBOXES],
        summary="Stop one service of the sandbox (main, or a compose service), as docker compose stop does",
        description="Every process of the service is killed (its pid namespace); its files still answer GET and "
        "PUT .../files, exec in it is 409 `service_stopped`, the rest of the sandbox runs on. Stopping a "
        "stopped service does nothing (204).",
        parameters=[
            SANDBOX_ID,
            OpenApiParameter("name", str, OpenApiParameter.PATH, description="main, or a compose service's name"),
        ],
        request=None,
        responses={204: None, **LIVE_ANSWERS},
    )
    def post(self, request, sandbox_id, name):
        _call(request, sandbox_id, {"op": "stop_service", "service": name}, timeout=180)
        return HttpResponse(status=204)


class SandboxFilesView(APIView):
    parser_classes: list = []  # the body is the file's bytes (or a tar), read as a stream

    @extend_schema(
        tags=[TAG_SANDBOXES],
        summary="A file's bytes, or a folder as a tar of its contents",
        parameters=[SANDBOX_ID, PATH, SERVICE],
        responses={
            (200, "application/octet-stream"): OpenApiTypes.BINARY,
            (200, "application/x-tar"): OpenApiTypes.BINARY,
            **LIVE_ANSWERS,
        },
    )
    def get(self, request, sandbox_id):
        params = request.query_params
        header = {"op": "get", "path": params.get("path"), "service": params.get("service")}
        answer, conn = _ask(request, sandbox_id, header, timeout=300)
        folder = answer.get("kind") == "folder"
        response = StreamingHttpResponse(
            conn.body(None if folder else answer["length"]),
            content_type="application/x-tar" if folder else "application/octet-stream",
        )
        if not folder:
            response["Content-Length"] = str(answer["length"])
        return response

    @extend_schema(
        tags=[TAG_SANDBOXES],
        summary="Write one file (the body), or unpack a tar body under a folder (extract=tar)",
        parameters=[SANDBOX_ID, PATH, EXTRACT, SERVICE],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={
            204: None,
            **LIVE_ANSWERS,
            409: error("A path in the way, or still starting", "conflict", "starting"),
            411: error("No Content-Length", "length_required"),
            413: error("Over the sandbox's disk quota or file limit", "payload_too_large"),
            507: error("The host's disk is full", "insufficient_storage"),
        },
    )
    def put(self, request, sandbox_id):
        extract = request.query_params.get("extract")
        if extract not in (None, "", "tar"):
            raise ApiError(400, "bad_request", "extract: only tar")
        raw = request.META.get("CONTENT_LENGTH")
        if not raw:
            raise ApiError(411, "length_required", "PUT .../files needs a Content-Length")
        length = int(raw)
        path = request.query_params.get("path")
        try:
            files.check_path(path)
        except files.FileRequestError as exc:
            raise ApiError(exc.status, exc.code, exc.sentence) from None
        header = {"op": "put", "path": path, "extract": extract or None, "service": request.query_params.get("service")}
        try:
            _call(request, sandbox_id, header, body=request._request, length=length, timeout=600)
        finally:
            _drain(request._request)
        return HttpResponse(status=204)


_DRAIN_BYTES = 64 * 1024 * 1024


def _drain(stream) -> None:
    """What the sandbox refused to read (a body over its quota), read and dropped, up to 64 MiB, so
    the client reads the refusal instead of a broken pipe; past that, the connection closes."""
    left = _DRAIN_BYTES
    while left > 0 and (chunk := stream.read(min(left, _CHUNK))):
        left -= len(chunk)
