"""POST /evaluate with an agent project (SPEC §14): archives admitted, and every bad one a 400
naming its field with nothing created (no evaluation, no stored archive)."""

import base64
import hashlib
import json
import os
import stat
import tarfile

import pytest

from evaluations.models import AgentArchive, Evaluation
from tests.helpers.archives import Exec, archive_bytes, tar_member, write_tar, write_zip, zip_member

pytestmark = pytest.mark.django_db

TASK_URL = "https://example.com/task.tar.gz"
PROJECT = {"agent.py": "import helper\nhelper.run()\n", "helper.py": "def run():\n    pass\n"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def post(api, body):
    return api.post("/evaluate", data=json.dumps(body), content_type="application/json")


def archive_body(data: bytes, **extra) -> dict:
    return {"agent_archive": b64(data), "task_url": TASK_URL, **extra}


def assert_refused(response, field: str, words: str):
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["error"] == "invalid_request"
    assert field in body["fields"], body
    assert words in " ".join(body["fields"][field]), body
    assert Evaluation.objects.count() == 0 and AgentArchive.objects.count() == 0


@pytest.mark.parametrize("fmt", ["tar.gz", "zip"])
@pytest.mark.parametrize("top", [None, "my-agent"])
def test_a_project_at_the_root_or_in_one_top_folder_is_admitted_with_its_hash(api, fmt, top):
    data = archive_bytes(PROJECT, fmt, top=top)
    response = post(api, archive_body(data))
    assert response.status_code == 202, response.content
    evaluation = Evaluation.objects.get(id=response.json()["eval_id"])
    assert evaluation.agent_code == "" and evaluation.agent_archive.data == data
    assert evaluation.agent_sha256 == hashlib.sha256(data).hexdigest() == evaluation.agent_archive_id
    assert evaluation.agent_entrypoint == "agent.py"  # the one found, relative to the project root
    body = api.get(f"/evaluate/{evaluation.id}").json()
    assert body["agent_sha256"] == hashlib.sha256(data).hexdigest()
    assert "agent_archive" not in body and "agent_code" not in body


@pytest.mark.parametrize(
    ("language", "files", "entry"),
    [
        ("python", {"main.py": "", "lib.py": ""}, "main.py"),
        ("python", {"agent.py": "", "main.py": ""}, "agent.py"),
        ("bash", {"agent.sh": Exec("echo hi\n")}, "agent.sh"),
        ("node", {"index.js": "", "package.json": "{}"}, "index.js"),
        ("node", {"agent.js": "", "index.js": ""}, "agent.js"),
    ],
)
def test_the_default_entry_point_by_language(api, language, files, entry):
    response = post(api, archive_body(archive_bytes(files), agent_language=language))
    assert response.status_code == 202, response.content
    assert Evaluation.objects.get().agent_entrypoint == entry


def test_a_named_entry_point_inside_the_project(api):
    data = archive_bytes({"src/run.py": "", "src/util.py": "", "README": ""}, top="proj")
    response = post(api, archive_body(data, agent_entrypoint="./src//run.py"))
    assert response.status_code == 202, response.content
    assert Evaluation.objects.get().agent_entrypoint == "src/run.py"


def test_the_check_reads_the_headers_and_writes_no_member(api, monkeypatch):
    """The web worker never extracts (up to MAX_EXTRACTED_BYTES a request): the pipeline does, at installing_agent."""
    from evaluations.pipeline import archive

    extracted = []
    monkeypatch.setattr(archive, "_extract", lambda *args: extracted.append(args))
    data = archive_bytes({**PROJECT, "weights.bin": b"\0" * (32 << 20)})  # 32 MiB, a few KB compressed
    response = post(api, archive_body(data))
    assert response.status_code == 202, response.content
    assert extracted == [] and Evaluation.objects.get().agent_entrypoint == "agent.py"


def test_the_body_cap_makes_room_for_an_archive_at_its_cap_in_base64(api, executor_config):
    executor_config(max_agent_code_bytes=1, max_agent_archive_bytes=3 << 20)
    data = archive_bytes({**PROJECT, "weights.bin": os.urandom(2 << 20)})  # incompressible: 2.7 MiB in base64
    assert len(data) < 3 << 20
    response = post(api, archive_body(data))
    assert response.status_code == 202, response.content
    assert Evaluation.objects.get().agent_archive.data == data


def test_the_same_archive_twice_is_stored_once(api):
    data = archive_bytes(PROJECT)
    assert post(api, archive_body(data)).status_code == 202
    assert post(api, archive_body(data)).status_code == 202
    assert Evaluation.objects.count() == 2 and AgentArchive.objects.count() == 1


def test_invalid_base64(api):
    assert_refused(post(api, {"agent_archive": "not base64!!", "task_url": TASK_URL}), "agent_archive", "base64")


def test_over_the_cap(api, executor_config):
    data = archive_bytes({"agent.py": "x" * 4000})
    executor_config(max_agent_archive_bytes=len(data) - 1)
    assert_refused(post(api, archive_body(data)), "agent_archive", "at most")


def test_over_the_cap_of_extracted_bytes(api, executor_config):
    executor_config(max_extracted_bytes=1000)
    assert_refused(post(api, archive_body(archive_bytes({"agent.py": "#" * 2000}))), "agent_archive", "1000 bytes")


def test_over_the_cap_of_members(api, executor_config):
    executor_config(max_archive_members=3)
    files = {f"m{i}.py": "" for i in range(4)} | {"agent.py": ""}
    assert_refused(post(api, archive_body(archive_bytes(files))), "agent_archive", "more than 3 members")


def test_not_an_archive(api):
    assert_refused(post(api, archive_body(b"print('hi')\n")), "agent_archive", "not a .tar.gz")


@pytest.mark.parametrize(
    ("member", "words"),
    [
        (tar_member("helper.py", tarfile.SYMTYPE, linkname="/etc/passwd"), "symbolic link"),
        (tar_member("helper.py", tarfile.LNKTYPE, linkname="agent.py"), "hard link"),
        (tar_member("../escape.py"), "'..'"),
        (tar_member("/abs.py"), "absolute"),
    ],
)
def test_hostile_tar_members(api, tmp_path, member, words):
    content = b"" if member.isfile() else None
    data = write_tar(tmp_path / "a.tar.gz", [(tar_member("agent.py"), b"pass\n"), (member, content)]).read_bytes()
    assert_refused(post(api, archive_body(data)), "agent_archive", words)


def test_a_zip_with_a_symbolic_link(api, tmp_path):
    entries = [(zip_member("agent.py"), b"pass\n"), (zip_member("lib", file_type=stat.S_IFLNK, mode=0o777), b"/etc")]
    data = write_zip(tmp_path / "a.zip", entries).read_bytes()
    assert_refused(post(api, archive_body(data)), "agent_archive", "symbolic link")


def test_no_entry_point(api):
    data = archive_bytes({"helper.py": "", "requirements.txt": "six\n"})
    assert_refused(post(api, archive_body(data)), "agent_archive", "no entry point")


def test_no_entry_point_for_the_language(api):
    assert_refused(post(api, archive_body(archive_bytes(PROJECT), agent_language="node")), "agent_archive", "agent.js")


@pytest.mark.parametrize(
    ("entrypoint", "words"),
    [
        ("../agent.py", "'..'"),
        ("/etc/passwd", "relative path"),
        ("src/../../x.py", "'..'"),
        ("missing.py", "is not a file"),
        ("src", "is not a file"),
        ("", "may not be blank"),
    ],
)
def test_a_bad_entry_point(api, entrypoint, words):
    data = archive_bytes({"src/run.py": "", "agent.py": ""})
    assert_refused(post(api, archive_body(data, agent_entrypoint=entrypoint)), "agent_entrypoint", words)


@pytest.mark.parametrize("entrypoint", ["proj/agent.py", "agent.py"])
def test_an_entry_point_from_the_root_or_from_the_single_top_folder(api, entrypoint):
    response = post(api, archive_body(archive_bytes({"agent.py": ""}, top="proj"), agent_entrypoint=entrypoint))
    assert response.status_code == 202, response.content
    assert Evaluation.objects.get().agent_entrypoint == entrypoint


@pytest.mark.parametrize(
    "body",
    [
        {"task_url": TASK_URL},
        {"agent_code": "print(1)", "agent_archive": b64(archive_bytes(PROJECT)), "task_url": TASK_URL},
    ],
)
def test_both_or_neither_of_code_and_archive(api, body):
    response = post(api, body)
    assert_refused(response, "agent_archive", "exactly one of agent_code and agent_archive")
    assert "agent_code" in response.json()["fields"]


def test_an_entry_point_without_an_archive(api):
    assert_refused(
        post(api, {"agent_code": "x", "agent_entrypoint": "a.py", "task_url": TASK_URL}), "agent_entrypoint", ""
    )
