"""A live sandbox's environment (SPEC §24): an image, a Dockerfile with its uploaded context, or a
task's own environment named by its URL."""

from __future__ import annotations

import io
import json
import tarfile
import uuid
from pathlib import Path

from tests.helpers.archives import Exec, write_archive


def tar_of(files: dict[str, bytes]) -> bytes:
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return packed.getvalue()


def multipart(spec: dict, context: bytes | None) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="spec"\r\nContent-Type: application/json\r\n\r\n'.encode()
        + json.dumps(spec).encode()
        + b"\r\n"
    ]
    if context is not None:
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="context"; filename="context.tar.gz"\r\n'
            f"Content-Type: application/gzip\r\n\r\n".encode()
            + context
            + b"\r\n"
        )
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def create_multipart(api, spec, context):
    body, content_type = multipart(spec, context)
    response = api.call("POST", "/sandboxes", raw=body, headers={"Content-Type": content_type}, timeout=600)
    return response.status, json.loads(response.body)


def test_a_dockerfile_is_built_from_the_uploaded_context(api, image_ref):
    context = tar_of(
        {
            "docker/Dockerfile": f"FROM {image_ref}\nCOPY note.txt /note.txt\nRUN echo built > /built.txt\nWORKDIR /srv\n".encode(),
            "note.txt": b"from the context\n",  # the context is the whole upload, as docker build -f docker/Dockerfile .
        }
    )
    status, body = create_multipart(api, {"environment": {"dockerfile": "docker/Dockerfile"}}, context)
    assert status in (201, 202), body
    sandbox_id = body["sandbox_id"]
    try:
        if status == 202:
            from tests.helpers.polling import wait_for

            body = wait_for(lambda: api.settled(sandbox_id), timeout=600, what="the build")
        assert body["status"] == "ready" and body["environment"]["kind"] == "dockerfile", body
        result = api.exec(sandbox_id, "cat /note.txt /built.txt; pwd")
        assert result["stdout"] == "from the context\nbuilt\n/srv\n", result
    finally:
        api.call("DELETE", f"/sandboxes/{sandbox_id}")


def test_a_bad_context_or_dockerfile_is_the_callers_fault(api, image_ref):
    status, body = create_multipart(api, {"environment": {"dockerfile": "Dockerfile"}}, None)
    assert status == 400 and "context" in body["detail"], body
    status, body = create_multipart(api, {"environment": {"dockerfile": "Dockerfile"}}, b"not a tar at all")
    assert status == 400 and body["error"] == "task_invalid", body
    status, body = create_multipart(
        api, {"environment": {"dockerfile": "Missing"}}, tar_of({"Dockerfile": b"FROM x\n"})
    )
    assert status == 400 and "Missing" in body["detail"], body
    failing = tar_of({"Dockerfile": f"FROM {image_ref}\nRUN echo about to fail && false\n".encode()})
    status, body = create_multipart(api, {"environment": {"dockerfile": "Dockerfile"}}, failing)
    assert status == 400 and body["error"] == "task_invalid", body
    status, body = create_multipart(api, {"environment": {"dockerfile": "../Dockerfile"}}, failing)
    assert status == 400 and "environment.dockerfile" in body["detail"], body


def test_a_tasks_own_environment(api, image_ref, web):
    name = f"task-{uuid.uuid4().hex[:8]}.tar.gz"
    write_archive(
        Path(web.www) / name,
        {
            "task.toml": f'[environment]\ndocker_image = "{image_ref}"\nworkdir = "/app"\n',
            "instruction.md": "Write 42 to /app/answer.txt.\n",
            "tests/test.sh": Exec("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"),
        },
        "tar.gz",
        top="task",
    )
    body = api.create({"environment": {"task_url": web.url(f"/{name}")}})
    try:
        assert body["environment"]["kind"] == "task_url"
        assert api.exec(body["sandbox_id"], "pwd")["stdout"] == "/app\n"
    finally:
        api.call("DELETE", f"/sandboxes/{body['sandbox_id']}")


COMPOSE_MAIN_VOLUME = "services:\n  main: {volumes: ['evidence:/startup']}\nvolumes:\n  evidence:\n"


def test_a_tasks_compose_volume_in_main_alone_is_bound_there(api, sandbox_service, image_ref, web):
    """A compose file whose only service is main, with a named volume: a folder of the session bound at
    its target (SPEC §23-24; with services too: test_compose_volumes.py)."""
    name = f"compose-{uuid.uuid4().hex[:8]}.tar.gz"
    write_archive(
        Path(web.www) / name,
        {
            "task.toml": f'[environment]\ndocker_image = "{image_ref}"\n',
            "instruction.md": "Do it.\n",
            "environment/docker-compose.yaml": COMPOSE_MAIN_VOLUME,
            "tests/test.sh": Exec("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"),
        },
        "tar.gz",
        top="task",
    )
    sandbox_id = api.create({"environment": {"task_url": web.url(f"/{name}")}})["sandbox_id"]
    try:
        assert api.exec(sandbox_id, "echo kept > /startup/kept.txt")["exit_code"] == 0
        volume = Path(sandbox_service.sessions) / f"sandbox-{sandbox_id}" / "volumes" / "evidence"
        assert (volume / "kept.txt").read_text() == "kept\n"
    finally:
        api.call("DELETE", f"/sandboxes/{sandbox_id}")


def test_a_task_without_an_image_cannot_be_a_sandbox(api, web):
    name = f"workspace-{uuid.uuid4().hex[:8]}.tar.gz"
    write_archive(
        Path(web.www) / name,
        {
            "workspace.yaml": "repo: https://example.org/repo.git\nbase_commit: " + "a" * 40 + "\n",
            "prompt.md": "Do it.\n",
            "tests/t.sh": Exec("#!/bin/sh\ntrue\n"),
        },
        "tar.gz",
        top="task",
    )
    status, body = api.json("POST", "/sandboxes", {"environment": {"task_url": web.url(f"/{name}")}})
    assert status == 400 and body["error"] == "task_invalid" and "image" in body["detail"], body
    status, body = api.json("POST", "/sandboxes", {"environment": {"task_url": web.url("/missing.tar.gz")}})
    assert status == 400 and body["error"] == "task_invalid", body
