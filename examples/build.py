#!/usr/bin/env python3
"""Build the example tasks: a real git repository per task (served over dumb HTTP
as a bare repo), the task as a folder and as an archive, and a ready POST /evaluate body.

    examples/build.py http://127.0.0.1:8000 [OUT_DIR]

then serve OUT_DIR (default examples/build) at that URL, e.g.
    python3 -m http.server 8000 --bind 127.0.0.1 --directory examples/build

Each example is examples/<name>/ with repo/ (the base commit), future/ (the
fix, committed after the base and tagged, so the executor must hide it),
task/ (workspace.yaml with {repo_url} and {base_commit} to fill, prompt.md,
tests/, checks.txt), and solve_agent.* and noop_agent.* (the extension names
the language). It builds into OUT_DIR as <name>.git, <name>-task/ (the task
folder, for `manage.py evaluate`), <name>-task.tar.gz and <name>-request.json.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIT_ENV = {
    "GIT_AUTHOR_NAME": "example", "GIT_AUTHOR_EMAIL": "example@localhost",
    "GIT_COMMITTER_NAME": "example", "GIT_COMMITTER_EMAIL": "example@localhost",
    "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin",
}  # fmt: skip


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True, text=True
    ).stdout.strip()


def make_repo(source: Path, work: Path, future: dict[str, str]) -> str:
    """Commit `source` as the base, then `future` (the fix) on top, tagged; return the base sha."""
    shutil.copytree(source, work)
    git("init", "-q", "-b", "main", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "base", cwd=work)
    base = git("rev-parse", "HEAD", cwd=work)
    for name, text in future.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    git("add", "-A", cwd=work)  # the fix may add files (an SWE-style fix adds its tests)
    git("commit", "-q", "-m", "the fix (future)", cwd=work)
    git("tag", "v-fixed", cwd=work)
    return base


def serve_bare(work: Path, bare: Path) -> None:
    git("clone", "-q", "--bare", str(work), str(bare), cwd=work.parent)
    git("update-server-info", cwd=bare)


def task_folder(task_dir: Path, substitutions: dict[str, str], out: Path) -> None:
    """The task as its author publishes it: workspace.yaml filled in, scripts executable."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(task_dir, out)
    workspace = out / "workspace.yaml"
    workspace.write_text(workspace.read_text().format(**substitutions))
    for script in out.rglob("*.sh"):
        script.chmod(0o755)


def task_archive(folder: Path, out: Path, top: str) -> None:
    with tarfile.open(out, "w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            if path.is_dir():
                continue
            data = path.read_bytes()
            info = tarfile.TarInfo(f"{top}/{path.relative_to(folder)}")
            info.size = len(data)
            info.mode = 0o755 if path.suffix == ".sh" else 0o644
            tar.addfile(info, io.BytesIO(data))


def future_files(example: Path) -> dict[str, str]:
    """The files of the later commit that holds the fix (examples/<name>/future/)."""
    future = example / "future"
    return {str(p.relative_to(future)): p.read_text() for p in sorted(future.rglob("*")) if p.is_file()}


def build(name: str, base_url: str, out_dir: Path) -> dict:
    """Build one example into out_dir; return {"archive", "request", "base_commit"}."""
    example = HERE / name
    out_dir.mkdir(parents=True, exist_ok=True)
    work = out_dir / f"{name}-work"
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(out_dir / f"{name}.git", ignore_errors=True)
    base = make_repo(example / "repo", work, future_files(example))
    serve_bare(work, out_dir / f"{name}.git")
    folder = out_dir / f"{name}-task"
    task_folder(example / "task", {"repo_url": f"{base_url}/{name}.git", "base_commit": base}, folder)
    archive = out_dir / f"{name}-task.tar.gz"
    task_archive(folder, archive, f"{name}-task")
    solver = agent(example, "solve")
    request = {
        "agent_code": solver.read_text(),
        "agent_language": LANGUAGES[solver.suffix],
        "task_url": f"{base_url}/{archive.name}",
    }
    (out_dir / f"{name}-request.json").write_text(json.dumps(request))
    return {"archive": archive, "folder": folder, "request": request, "base_commit": base}


LANGUAGES = {".py": "python", ".sh": "bash", ".js": "node"}


def agent(example: Path, kind: str) -> Path:
    """examples/<name>/<kind>_agent.<ext>: kind is solve or noop."""
    (found,) = [p for p in example.glob(f"{kind}_agent.*") if p.suffix in LANGUAGES]
    return found


def examples() -> list[str]:
    return sorted(p.parent.parent.name for p in HERE.glob("*/task/workspace.yaml"))


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "build"
    for example in examples():
        built = build(example, sys.argv[1].rstrip("/"), out)
        print(
            f"{example}: task {built['folder']} and {built['archive']} (base {built['base_commit'][:12]}), "
            f"request body {out / (example + '-request.json')}"
        )


if __name__ == "__main__":
    main()
