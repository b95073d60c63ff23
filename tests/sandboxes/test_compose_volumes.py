"""A live sandbox's compose volumes (SPEC §23-24), made as an evaluation's (pipeline/volumes.py): a named
volume one folder of the session bound in main and in every service naming it (``ro`` honoured, the disk
quota counting it), Harbor's log folders in a service (``${HOST_ARTIFACTS_PATH}:${ENV_ARTIFACTS_PATH}``)
the folder main has at /logs/artifacts; ``GET``/``PUT .../files`` see what the sandbox sees there, and a
link the sandbox plants in a volume never leads a file operation of the host out of it."""

from __future__ import annotations

import io
import tarfile
import uuid
from pathlib import Path

from tests.helpers.polling import wait_for
from tests.sandboxes.test_compose import task_url
from tests.sandboxes.test_environments import tar_of
from tests.sandboxes.test_lifecycle import leftovers

SLEEP = "exec sleep infinity"


def volumes_compose(image_ref: str, side_command: str, *, main=None, side=None, volumes=None) -> dict:
    """main (the task's image) and ``side``, each with the volumes given, and the file's own."""
    compose = {
        "services": {
            "main": {"volumes": main or []},
            "side": {"image": image_ref, "command": ["sh", "-c", side_command], "volumes": side or []},
        }
    }
    if volumes is not None:
        compose["volumes"] = volumes
    return compose


def members(body: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:") as archive:
        return {member.name: member for member in archive.getmembers()}


def read_member(body: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:") as archive:
        return archive.extractfile(name).read()


def test_a_named_volume_is_shared_by_main_and_a_service(api, sandbox_service, image_ref, web):
    """One folder at main's /srv/shared and the service's /data (and, read-only, its /view): what either
    writes the other reads, through exec and through the API's files, a folder above the volume read
    as a tar with the volume's contents; the read-only view refuses writes, the API's too."""
    compose = volumes_compose(
        image_ref,
        f"echo from-side > /data/side.txt; {SLEEP}",
        main=["shared:/srv/shared"],
        side=["shared:/data", {"type": "volume", "source": "shared", "target": "/view", "read_only": True}],
        volumes={"shared": None},
    )
    sandbox_id = api.create({"environment": {"task_url": task_url(web, image_ref, compose)}})["sandbox_id"]
    files = f"/sandboxes/{sandbox_id}/files"
    try:
        seen = wait_for(lambda: api.exec(sandbox_id, "cat /srv/shared/side.txt")["stdout"], what="the side's file")
        assert seen == "from-side\n"
        assert api.exec(sandbox_id, "echo from-main > /srv/shared/main.txt")["exit_code"] == 0
        assert api.exec(sandbox_id, "cat /data/main.txt /view/main.txt", service="side")["stdout"] == "from-main\n" * 2
        # the API's files: written in main's, read in the service's, and the other way round
        assert api.call("PUT", f"{files}?path=/srv/shared/put/deep.txt", raw=b"put\n").status == 204
        assert api.exec(sandbox_id, "cat /data/put/deep.txt", service="side")["stdout"] == "put\n"
        response = api.call("GET", f"{files}?path=/data/side.txt&service=side")
        assert response.status == 200 and response.body == b"from-side\n"
        response = api.call("GET", f"{files}?path=/srv/shared/main.txt")
        assert response.status == 200 and response.body == b"from-main\n"
        # a folder holding the volume: the volume's contents, not the empty folder under it
        response = api.call("GET", f"{files}?path=/srv")
        assert response.status == 200
        assert read_member(response.body, "shared/side.txt") == b"from-side\n"
        assert "shared/put/deep.txt" in members(response.body)
        # the read-only view: the service cannot write it, nor can the API
        result = api.exec(sandbox_id, "echo x > /view/nope.txt", service="side")
        assert result["exit_code"] != 0 and "Read-only" in result["stderr"], result
        response = api.call("PUT", f"{files}?path=/view/nope.txt&service=side", raw=b"x")
        assert response.status == 409 and b"read-only volume" in response.body, response.body
        response = api.call("PUT", f"{files}?path=/view&service=side&extract=tar", raw=tar_of({"a": b"a"}))
        assert response.status == 409, response.body
        assert api.exec(sandbox_id, "ls /srv/shared")["stdout"].split() == ["main.txt", "put", "side.txt"]
        # the volume is a folder of the sandbox's session on the host
        session = Path(sandbox_service.sessions) / f"sandbox-{sandbox_id}"
        assert (session / "volumes" / "shared" / "side.txt").read_text() == "from-side\n"
        # a path at the volume itself is a folder, not a file to write
        response = api.call("PUT", f"{files}?path=/srv/shared", raw=b"x")
        assert response.status == 409 and b"is a folder" in response.body, response.body
    finally:
        assert api.call("DELETE", f"/sandboxes/{sandbox_id}").status == 204
    assert wait_for(lambda: not leftovers(sandbox_service, sandbox_id), what="nothing left")


def test_a_sidecars_artifacts_folder_is_mains(api, image_ref, web):
    """Harbor's sidecar-artifacts: ``${HOST_ARTIFACTS_PATH}:${ENV_ARTIFACTS_PATH}`` in a service binds
    the folder main has at /logs/artifacts: what the sidecar writes there, main's GET shows."""
    compose = volumes_compose(
        image_ref,
        f"echo evidence > /logs/artifacts/side.txt; {SLEEP}",
        side=["${HOST_ARTIFACTS_PATH}:${ENV_ARTIFACTS_PATH}"],
    )
    sandbox_id = api.create({"environment": {"task_url": task_url(web, image_ref, compose)}})["sandbox_id"]
    files = f"/sandboxes/{sandbox_id}/files"
    try:
        # Harbor's client makes the log folders at its start (ensure_dirs), a bound one too
        made = api.exec(sandbox_id, "mkdir -p /logs/agent /logs/verifier /logs/artifacts && chmod 777 /logs/*")
        assert made["exit_code"] == 0, made
        response = wait_for(
            lambda: (answer := api.call("GET", f"{files}?path=/logs/artifacts/side.txt")).status == 200 and answer,
            what="the sidecar's artifact in main's /logs/artifacts",
        )
        assert response.body == b"evidence\n"
        assert api.exec(sandbox_id, "cat /logs/artifacts/side.txt")["stdout"] == "evidence\n"
        response = api.call("GET", f"{files}?path=/logs/artifacts")  # what Harbor downloads
        assert response.status == 200 and read_member(response.body, "side.txt") == b"evidence\n"
        response = api.call("GET", f"{files}?path=/logs")
        assert read_member(response.body, "artifacts/side.txt") == b"evidence\n"
        assert {"agent", "verifier", "artifacts"} <= set(members(response.body))
        # main's writes reach the sidecar; /logs/agent stays main's own (no service binds it)
        assert api.call("PUT", f"{files}?path=/logs/artifacts/main.txt", raw=b"main\n").status == 204
        assert api.exec(sandbox_id, "cat /logs/artifacts/main.txt", service="side")["stdout"] == "main\n"
        assert api.exec(sandbox_id, "echo agent > /logs/agent/a.txt")["exit_code"] == 0
        assert api.exec(sandbox_id, "test -e /logs/agent/a.txt", service="side")["exit_code"] == 1
    finally:
        api.call("DELETE", f"/sandboxes/{sandbox_id}")


def test_a_link_planted_in_a_volume_leads_no_file_operation_out_of_it(api, sandbox_service, image_ref, web):
    """Links the sandbox puts in a volume (to /, up past it, to the session's host path) are followed
    inside the volume by the host's file operations, as if it were the root: nothing outside it is
    read or written, neither the host's files nor the image's."""
    compose = volumes_compose(
        image_ref,
        SLEEP,
        main=["data:/data"],
        side=["data:/data", "${HOST_ARTIFACTS_PATH}:${ENV_ARTIFACTS_PATH}"],
        volumes={"data": None},
    )
    sandbox_id = api.create({"environment": {"task_url": task_url(web, image_ref, compose)}})["sandbox_id"]
    files = f"/sandboxes/{sandbox_id}/files"
    session = Path(sandbox_service.sessions) / f"sandbox-{sandbox_id}"
    marker = f"escaped-{uuid.uuid4().hex[:8]}"
    try:
        assert (session / "log.txt").exists()  # a file of the host the links aim at
        plant = (
            f"ln -s / /data/root; ln -s ../../../../../../../.. /data/up; ln -s {session} /data/session; "
            f"ln -s {session}/log.txt /data/log; ln -s /etc /logs/artifacts/host-etc; ln -s / /logs/artifacts/root"
        )
        assert api.exec(sandbox_id, plant)["exit_code"] == 0
        aimed = (f"/data/up{session}/log.txt", f"/data/root{session}/log.txt", "/data/root/etc/hostname")
        for path in ("/data/log", "/data/session/log.txt", *aimed, "/logs/artifacts/host-etc/passwd",
                     "/logs/artifacts/root/etc/passwd"):  # fmt: skip
            response = api.call("GET", f"{files}?path={path}")
            assert response.status == 404, (path, response.status, response.body[:200])
        # writes through them land inside the volume: not on the host, not in the image's root
        for path in (f"/data/root/tmp/{marker}", f"/data/up/tmp/{marker}-up", f"/data/session/{marker}"):
            assert api.call("PUT", f"{files}?path={path}", raw=b"x").status == 204, path
        archive = tar_of({f"{marker}-tar": b"x", f"sub/{marker}-tar": b"x"})
        assert api.call("PUT", f"{files}?path=/data/root/etc&extract=tar", raw=archive).status == 204
        assert not Path(f"/tmp/{marker}").exists() and not Path(f"/tmp/{marker}-up").exists()
        assert not (session / marker).exists() and not Path(f"/etc/{marker}-tar").exists()
        assert api.exec(sandbox_id, f"test -e /tmp/{marker} || test -e /etc/{marker}-tar")["exit_code"] == 1
        volume = session / "volumes" / "data"
        assert (volume / "tmp" / marker).is_file() and (volume / "tmp" / f"{marker}-up").is_file()
        assert (volume / "etc" / f"{marker}-tar").is_file() and (volume / "etc" / "sub" / f"{marker}-tar").is_file()
        assert (volume / session.relative_to("/") / marker).is_file()
        # a folder read as a tar keeps links as links, never what they name
        response = api.call("GET", f"{files}?path=/logs/artifacts")
        found = members(response.body)
        assert found["host-etc"].issym() and found["host-etc"].linkname == "/etc" and "host-etc/passwd" not in found
        response = api.call("GET", f"{files}?path=/data/root/etc/{marker}-tar")
        assert response.status == 200 and response.body == b"x"  # in the volume: its etc/, not the host's
    finally:
        api.call("DELETE", f"/sandboxes/{sandbox_id}")


def test_a_volume_counts_against_the_sandboxs_disk_quota(api, image_ref, web):
    """A service filling a volume past ``storage_mb`` ends the sandbox, as its writable layer would."""
    fill = "head -c 20M /dev/zero > /fill/a; head -c 20M /dev/zero > /fill/b"
    compose = volumes_compose(image_ref, f"{fill}; {SLEEP}", side=["fill:/fill"], volumes={"fill": None})
    spec = {"environment": {"task_url": task_url(web, image_ref, compose)}, "storage_mb": 32}
    status, body = api.json("POST", "/sandboxes", spec)
    if status >= 300:  # over its quota before it was ready
        assert status == 503 and body["error"] == "limit_exceeded" and "disk quota exceeded" in body["detail"], body
        return
    sandbox_id = body["sandbox_id"]

    def ended():
        found = api.json("GET", f"/sandboxes/{sandbox_id}")[1]
        return found if found["status"] not in ("starting", "ready") else None

    body = wait_for(ended, timeout=120, what="the sandbox to end over its quota")
    assert body["status"] == "failed" and body["error_kind"] == "limit_exceeded", body
    assert "disk quota exceeded" in body["error"], body
