"""Real git repositories for tests: build, mirror, and serve over dumb HTTP.

``make_repo`` commits on the current branch; a commit dict maps file paths to
contents (``None`` deletes the file), plus optional keys:

- ``":message"``: the commit message (default ``"commit N"``);
- ``":branch"``: check out this branch (created from the current commit)
  before committing;
- ``":tag"``: tag the new commit with this name (annotated).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

GIT_TEST_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/nonexistent",
    "LANG": "C.UTF-8",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "Test Author",
    "GIT_AUTHOR_EMAIL": "author@example.com",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "Test Committer",
    "GIT_COMMITTER_EMAIL": "committer@example.com",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
}


def git(repo: Path, *args: str, check: bool = True) -> str:
    """Run git in ``repo`` with a test identity; return stdout stripped."""
    proc = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args],
        cwd=repo,
        env=GIT_TEST_ENV,
        capture_output=True,
        text=True,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc.stdout.strip()


def make_repo(path: Path, commits: list[dict[str, str | None]]) -> list[str]:
    """Create a repository at ``path`` with ``commits``; return their shas in order."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "--quiet")
    shas = []
    for number, commit in enumerate(commits, start=1):
        if branch := commit.get(":branch"):
            git(path, "checkout", "--quiet", "-B", branch)
        for name, content in commit.items():
            if name.startswith(":"):
                continue
            target = path / name
            if content is None:
                git(path, "rm", "--quiet", "--", name)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
            git(path, "add", "--", name)
        git(path, "commit", "--quiet", "--allow-empty", "-m", commit.get(":message") or f"commit {number}")
        shas.append(git(path, "rev-parse", "HEAD"))
        if tag := commit.get(":tag"):
            git(path, "tag", "-a", "-m", tag, tag)
    return shas


def make_many_tags(path: Path, per_side: int) -> tuple[Path, str, list[str]]:
    """A repository at ``path`` of 200 commits on main, ``per_side`` annotated (``old-aN``) and as many
    lightweight (``old-lN``) tags spread over the first 100, and as many (``new-aN``, ``new-lN``) over
    the last 100, made with one ``git fast-import``. Returns (path, the 100th commit: the base, the
    names of the tags it reaches). Tag ``old-aN`` is dated N seconds after the first, so the newest
    annotated tag of the base is ``old-a<per_side - 1>`` when ``per_side`` is a multiple of 100."""
    path.mkdir(parents=True)
    git(path, "init", "--quiet")
    stream = []
    for n in range(1, 201):
        stream += ["commit refs/heads/main", f"mark :{n}", f"committer T <t@example.com> {1700000000 + n} +0000"]
        stream += [f"data {len(f'c{n}')}", f"c{n}"]
        stream += [] if n == 1 else [f"from :{n - 1}"]
        stream += ["M 644 inline f.txt", f"data {len(str(n))}", str(n)]
    for side, first in (("old", 1), ("new", 101)):
        for i in range(per_side):
            mark = first + i % 100
            message = f"{side} {i}"
            stream += [f"tag {side}-a{i}", f"from :{mark}", f"tagger T <t@example.com> {1700000000 + i} +0000"]
            stream += [f"data {len(message)}", message]
            stream += [f"reset refs/tags/{side}-l{i}", f"from :{mark}"]
    subprocess.run(
        ["git", "fast-import", "--quiet"],
        cwd=path,
        input="\n".join(stream) + "\n",
        text=True,
        check=True,
        env=GIT_TEST_ENV,
    )
    kept = sorted(f"old-{kind}{i}" for i in range(per_side) for kind in ("a", "l"))
    return path, git(path, "rev-parse", "main~100"), kept


def make_bare(src: Path, dest: Path, *, loose: bool = False) -> Path:
    """A bare mirror of ``src`` at ``dest``, ready to serve as dumb HTTP files.

    Packed by default; ``loose=True`` stores every object as a loose file,
    which a dumb-HTTP client then fetches (and stores) one by one.
    """
    subprocess.run(
        ["git", "clone", "--quiet", "--mirror", "--no-local", "--", str(src), str(dest)],
        env=GIT_TEST_ENV,
        check=True,
        capture_output=True,
    )
    if loose:
        git(dest, "config", "gc.auto", "0")
        for pack in (dest / "objects" / "pack").glob("*.pack"):
            data = pack.read_bytes()
            for part in dest.joinpath("objects", "pack").glob(pack.stem + ".*"):
                part.unlink()
            subprocess.run(["git", "unpack-objects", "-q"], cwd=dest, input=data, env=GIT_TEST_ENV, check=True)
    git(dest, "update-server-info")
    return dest


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@dataclasses.dataclass
class DumbHttpServer:
    root: Path
    url: str
    requests: list[str]


@contextlib.contextmanager
def serve_dumb_http(root: Path) -> Iterator[DumbHttpServer]:
    """Serve ``root`` read-only over HTTP on 127.0.0.1; yield its base URL."""
    requests: list[str] = []

    class Handler(_QuietHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield DumbHttpServer(root=root, url=f"http://{host}:{port}", requests=requests)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.contextmanager
def make_bare_served(src: Path, root: Path, name: str = "repo.git") -> Iterator[str]:
    """Mirror ``src`` into ``root/name`` and serve it over dumb HTTP; yield the clone URL."""
    root.mkdir(parents=True, exist_ok=True)
    make_bare(src, root / name)
    with serve_dumb_http(root) as server:
        yield f"{server.url}/{name}"


@dataclasses.dataclass
class RunResult:
    exit_code: int | None
    output: str
    timed_out: bool = False
    limit_detail: str | None = None


def subprocess_runner(argv: list[str], *, cwd: Path, env: dict[str, str], timeout_secs: float) -> RunResult:
    """The simplest CommandRunner: subprocess.run, output merged, timeout honoured."""
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout_secs,
        )
    except subprocess.TimeoutExpired as exc:
        output = exc.output.decode("utf-8", "replace") if exc.output else ""
        return RunResult(exit_code=None, output=output, timed_out=True)
    return RunResult(exit_code=proc.returncode, output=proc.stdout.decode("utf-8", "replace"))


# Python source an agent can run in its repository: ``forge(path)`` changes nothing in the work
# tree; it unpacks the repository's packs into loose objects (git reads a pack first, and the pack
# it last found an object in) and rewrites, under the id of the base's tree of ``path``'s folder,
# a tree whose entry for ``path`` names the blob of the file as it is now. git checks the hash of
# a commit and of the tree it names, not of the subtrees it reads, so a git reading that object
# store sees ``path`` unchanged. Prints "forged" and the tree's id.
FORGE_BASE_TREE = r"""
import os, pathlib, subprocess, zlib


def forge(path):
    def git(*args, **kwargs):
        return subprocess.run(["git", *args], check=True, capture_output=True, **kwargs).stdout

    folder, _, name = path.rpartition("/")
    tree = git("rev-parse", f"HEAD:{folder}").decode().strip()
    raw = git("cat-file", "tree", tree)
    old = bytes.fromhex(git("rev-parse", f"HEAD:{path}").decode().strip())
    new = bytes.fromhex(git("hash-object", "--", path).decode().strip())
    forged = raw.replace(name.encode() + b"\0" + old, name.encode() + b"\0" + new)
    assert forged != raw
    objects = pathlib.Path(git("rev-parse", "--git-path", "objects").decode().strip())
    for pack in sorted((objects / "pack").glob("*.pack")):
        data = pack.read_bytes()
        for kept in (objects / "pack").glob(pack.stem + ".*"):
            kept.unlink()
        git("unpack-objects", "-q", input=data)
    loose = objects / tree[:2] / tree[2:]
    loose.chmod(0o644)
    loose.write_bytes(zlib.compress(b"tree %d\0" % len(forged) + forged))
    print("forged", tree)
"""
