"""Git for the pipeline: clone at ``base_commit`` with the future hidden, and diff.

Every git command goes through a caller-supplied ``CommandRunner`` (the
project's one process spawner), so timeouts, output caps and kills are
handled there; this module only builds argv lists and reads results.

Hiding the future (``clone_at``)
--------------------------------
The agent must not be able to read the fix: no ref, tag, reflog entry,
remote, ``FETCH_HEAD`` or object that is not an ancestor of ``base_commit``.

1. ``git clone --bare`` straight into ``dest/.git``: every branch is a
   plain ``refs/heads/*`` (so a branch name resolves without ``origin/``),
   a bare clone writes no reflogs and no ``branch.*`` config, and nothing is
   checked out yet;
2. resolve ``base_commit`` (short sha, branch, tag, expression) to a full
   sha with ``rev-parse`` (a full sha needs no resolving) and check that it
   names a commit;
3. delete every ref file (``packed-refs``, ``refs/``, ``logs/``) and
   ``.keep`` file with one ``rm``: one ``update-ref -d`` per tag is slow;
4. turn the repository non-bare, drop ``remote.origin``, ``checkout
   --detach`` without a reflog and, unless the packs already hold exactly
   what the base reaches (``count-objects`` against ``rev-list``), run
   ``git repack -a -d``, which writes one pack of what HEAD and the index
   reach and deletes the clone's packs and the loose objects now packed;
5. the loose objects left (dumb HTTP stores objects loose) are exactly the
   unreachable ones: they are deleted, as ``git prune`` would. The tests
   check that the stored objects are exactly those reachable from
   ``base_commit``.

All of it is one ``sh`` script, so one command through the spawner: every
command costs a sandbox (bubblewrap's start: bench/RESULTS.md), and
this took 7, then 2 or 3.

Measured on a 2000-commit repository (500 small files, base 5 commits
behind the tip; medians of 7 runs on a shared 2-CPU host, +-0.05 s noise):

    ===========================  ========  ==========  ===============
    approach                     file://   dumb HTTP   dumb HTTP loose
    ===========================  ========  ==========  ===============
    bare clone + repack (this)   0.25 s    0.28 s      3.1 s
    clone + gc --prune=now       0.28 s    0.31 s      3.2 s
    clone + local fetch of base  0.35 s    0.40 s      3.1 s
    ===========================  ========  ==========  ===============

(The loose column is a dumb-HTTP server without packs: its 10000 GETs
dominate whatever is done after.) A fetch of only the base into a fresh
repository is correct by construction but pays ``index-pack`` on top of
``pack-objects``; ``gc`` is as fast within noise but also writes a
commit-graph and packs refs we delete, and an ordinary clone leaves
``branch.*`` config and reflogs to clean as well.

Hardening: hooks off and no template copied (``--template=``), only the
caller's protocols (``GIT_ALLOW_PROTOCOL``), no prompts, no system or global
config, no HTTP redirects (the caller checked the URL; a redirect could lead
elsewhere), only ``scheme://`` URLs (a local path would be cloned with
hardlinks and alternates), and arguments starting with ``-`` refused before
git runs.

The agent's patch (``repo_patch``)
----------------------------------
The agent owns ``repo/.git``: its config could name a ``core.fsmonitor``
command, filter drivers that ``git add`` would run, ``diff.external``, ...
So the diff never uses that git dir: a private, empty one in a scratch
folder is used, with the repository's objects only as read-only alternates,
a throwaway index that starts at ``base_sha``, and the new blobs written to
the private object store. The agent's index, refs and objects are untouched.
``init``, ``read-tree``, ``add`` and ``diff`` run as one ``sh`` script: one
sandbox instead of four.

``.gitignore``: honoured, as ``git add -A`` does, which is what SWE-bench
style harnesses do. Build junk the install step or the agent produces
(``node_modules/``, ``__pycache__/``, virtualenvs) stays out; a file the agent
hides with a ``.gitignore`` change is missing from the patch, but the
``.gitignore`` change itself is in it. Tracked files that match an ignore
rule are still diffed. The agent's ``.git/info/exclude`` and any global
excludes file are *not* used (the private git dir has none), so they
cannot hide files. Renames are written as deletion plus addition
(``--no-renames``), so text changes also apply with ``patch -p1``; binary
files need ``git apply``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import tempfile
import time
import unicodedata
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from evaluations.runtime.output import as_text

_SHA_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_HEX_RE = re.compile(r"^[0-9a-f]{4,64}$")
_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_PROTOCOL_LIST_RE = re.compile(r"^[a-z0-9+.-]+(?::[a-z0-9+.-]+)*$")
_MAX_REF_CHARS = 255

# Passed to every git command. `-c` overrides the repository's own config.
_GIT_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "protocol.ext.allow=never",
    "protocol.fd.allow=never",
    "http.followRedirects=false",
    "credential.helper=",
    "gc.auto=0",
    "maintenance.auto=false",
    "advice.detachedHead=false",
    "init.defaultBranch=main",
    "submodule.recurse=false",
)


def git_argv(*settings: str) -> list[str]:
    """git with the hardening settings above; the task importer's scratch clones use it too."""
    argv = ["git"]
    for item in (*_GIT_CONFIG, *settings):
        argv += ["-c", item]
    return argv


def _sh_git(*settings: str) -> str:
    """The same git prefix, as words of a shell script."""
    return " ".join(shlex.quote(word) for word in git_argv(*settings))


# The whole clone, in dest with GIT_DIR (dest/.git) and GIT_WORK_TREE (dest) set. $1 the URL,
# $2 base_commit, $3 "resolve" when it is not a full sha, $4 the address pin or "". A failing
# stage exits with its own code: _CLONE_STAGES names it for the message. It prints HEAD's sha last.
# Every process is an exec: one rm, and shell builtins where sed and wc were.
_NOT_A_COMMIT = 10
_BORROWS_OBJECTS = 21
_CLONE_FAILED = 20
_CLONE_SCRIPT = f"""
if [ -n "$4" ]; then
  {_sh_git()} -c "http.curloptResolve=$4" clone --bare --quiet --template= -- "$1" "$GIT_DIR" || exit {_CLONE_FAILED}
else
  {_sh_git()} clone --bare --quiet --template= -- "$1" "$GIT_DIR" || exit {_CLONE_FAILED}
fi
[ -e "$GIT_DIR/objects/info/alternates" ] && exit {_BORROWS_OBJECTS}
sha=$2
if [ "$3" = resolve ]; then
  sha=$({_sh_git()} rev-parse --verify --quiet --end-of-options "$2^{{commit}}") || exit {_NOT_A_COMMIT}
fi
{_sh_git()} cat-file -e "$sha^{{commit}}" 2>/dev/null || exit {_NOT_A_COMMIT}
# Every ref, reflog and fetch record goes (HEAD stays); refs/heads and refs/tags are made anew,
# empty, for the agent's own branches. A kept pack would survive the repack with the future in it.
cd "$GIT_DIR" || exit 22
rm -rf -- packed-refs FETCH_HEAD ORIG_HEAD logs refs objects/pack/*.keep || exit 22
mkdir -p refs/heads refs/tags || exit 22
cd "$GIT_WORK_TREE" || exit 22
counts=$({_sh_git()} count-objects -v) || exit 16
loose=-1 packed=-1
while read -r key value; do
  case $key in count:) loose=$value ;; in-pack:) packed=$value ;; esac
done <<COUNTS
$counts
COUNTS
{_sh_git()} config core.bare false || exit 11
{_sh_git()} config --remove-section remote.origin || exit 12
{_sh_git("core.logAllRefUpdates=false")} checkout --quiet --detach "$sha" -- || exit 13
# Repack unless the packs hold exactly what the base reaches and nothing is loose: a dumb-HTTP
# pack or a ref ahead of the base brings the future along. Then only unreachable objects are
# left loose: deleted, as git prune would.
reached=$({_sh_git()} rev-list --objects --count "$sha" --) || exit 17
if [ "$loose" != 0 ] || [ "$reached" -ne "$packed" ]; then
  {_sh_git()} repack -a -d -n -q || exit 14
  rm -rf -- "$GIT_DIR"/objects/[0-9a-f][0-9a-f] || exit 14
fi
{_sh_git()} rev-parse --verify --quiet HEAD || exit 15
"""
_CLONE_STAGES = {
    _NOT_A_COMMIT: "",
    _BORROWS_OBJECTS: "",
    _CLONE_FAILED: "",  # named with the URL by clone_at
    11: "git config",
    12: "git config",
    13: "git checkout",
    14: "git repack",
    15: "git rev-parse of HEAD",
    16: "git count-objects",
    17: "git rev-list",
    22: "removing the clone's refs",
}

# The agent patch, in the repository; $1 private git dir, $2 the agent's objects, $3 base sha,
# $4 the patch file, $5 the work tree, $6 the throwaway index, then the pathspec.
_PATCH_SETTINGS = ("core.bare=false", "core.filemode=true", "core.symlinks=true")
_PATCH_SCRIPT = f"""
{_sh_git()} init --quiet --bare --template= -- "$1" || exit 10
printf '%s\\n' "$2" > "$1/objects/info/alternates" || exit 11
export GIT_DIR="$1" GIT_WORK_TREE="$5" GIT_INDEX_FILE="$6" GIT_OPTIONAL_LOCKS=0
base=$3 out=$4
shift 6
{_sh_git(*_PATCH_SETTINGS)} read-tree "$base" || exit 12
{_sh_git(*_PATCH_SETTINGS)} add --all -- "$@" || exit 13
{_sh_git(*_PATCH_SETTINGS)} diff --cached --binary --no-renames --no-ext-diff --no-textconv --no-color \\
    --src-prefix=a/ --dst-prefix=b/ "--output=$out" "$base" -- "$@" || exit 14
"""
_PATCH_STAGES = {
    10: "git init",
    11: "writing the alternates file",
    12: "git read-tree of the base commit",
    13: "git add of the working tree",
    14: "git diff",
}


class GitError(Exception):
    """A git step failed; the message is one sentence naming the step and cause.

    ``transient``: the network failed (a timeout, a host that does not answer or resolve, a 5xx):
    another try may succeed. ``limit_exceeded``: the runtime stopped git for a limit (memory,
    disk, processes). Neither: the repository or the commit asked for is wrong.
    """

    def __init__(self, message: str, *, transient: bool = False, limit_exceeded: bool = False):
        super().__init__(message)
        self.transient = transient
        self.limit_exceeded = limit_exceeded


# What git and its libcurl print when the network, not the repository, failed; git exits 128 for
# both, so its words are all there is to tell them apart.
_NETWORK_TROUBLE = re.compile(
    r"Could not resolve (?:host|proxy)|Failed to connect|Couldn't connect|Connection refused|Connection reset"
    r"|timed out|Empty reply from server|early EOF|RPC failed|remote end hung up|Recv failure|Send failure"
    r"|returned error: (?:5\d\d|408|429)|Received HTTP code 5\d\d from proxy",
    re.IGNORECASE,
)


def network_trouble(output: str) -> bool:
    return bool(_NETWORK_TROUBLE.search(output))


class RunResult(Protocol):
    exit_code: int | None
    output: str
    timed_out: bool
    limit_detail: str | None


class CommandRunner(Protocol):
    def __call__(self, argv: list[str], *, cwd: Path, env: dict[str, str], timeout_secs: float) -> RunResult: ...


def git_env(home: Path, allow_protocol: str) -> dict[str, str]:
    """A clean environment for git: nothing of the service's, no prompts.

    ``allow_protocol`` is git's colon-separated list, e.g. ``"http:https"``.
    """
    if not _PROTOCOL_LIST_RE.match(allow_protocol):
        raise ValueError(f"bad GIT_ALLOW_PROTOCOL value: {allow_protocol!r}")
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/true",
        "GIT_ALLOW_PROTOCOL": allow_protocol,
        "GIT_PROTOCOL_FROM_USER": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_SYSTEM": "/dev/null",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_LFS_SKIP_SMUDGE": "1",
    }


def check_resolve_pin(resolve_pin: str | None) -> None:
    """A ``host:port:addr`` pin (``urlguard.git_resolve_pin``) that git's ``-c`` cannot misread."""
    if resolve_pin is not None and (_has_space_or_control(resolve_pin) or resolve_pin.startswith("-")):
        raise GitError(f"bad address pin {resolve_pin!r}")


def clone_at(
    run: CommandRunner,
    *,
    repo_url: str,
    base_commit: str,
    dest: Path,
    env: dict[str, str],
    timeout_secs: float,
    resolve_pin: str | None = None,
) -> str:
    """Clone ``repo_url`` into ``dest`` at ``base_commit``; return its full sha.

    ``dest`` must be absent or empty. HEAD is left detached at the commit, no
    ref, remote or reflog exists, and only the commit's ancestors are stored.
    ``timeout_secs`` bounds the whole step. ``resolve_pin``
    (``host:port:addr[,addr]``, see ``urlguard.git_resolve_pin``) makes git
    connect to the addresses the URL check approved instead of resolving
    the host again.
    """
    _check_repo_url(repo_url)
    _check_base_commit(base_commit)
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise GitError(f"clone destination {dest} is not an empty folder")
    check_resolve_pin(resolve_pin)
    shown_url = _display_url(repo_url)
    git = _Git(run, env, time.monotonic() + timeout_secs, timeout_secs)
    git_dir = dest / ".git"

    dest.mkdir(parents=True, exist_ok=True)
    try:
        result = git.script(
            _CLONE_SCRIPT,
            [repo_url, base_commit, "sha" if _SHA_RE.match(base_commit) else "resolve", resolve_pin or ""],
            stages={**_CLONE_STAGES, _CLONE_FAILED: f"git clone of {shown_url}"},
            cwd=dest,
            extra_env={"GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(dest)},
            what=f"git clone of {shown_url}",
            secret=_userinfo(repo_url),
        )
        if result.exit_code == _NOT_A_COMMIT:
            raise GitError(f"base_commit {base_commit} not found in {shown_url}")
        if result.exit_code == _BORROWS_OBJECTS:
            raise GitError("the clone borrows objects from another repository (alternates)")
        sha = _last_sha(result.output)
        if sha is None:
            raise GitError(f"git rev-parse of HEAD failed: {git_message(result.output) or 'no sha printed'}")
    except BaseException:
        shutil.rmtree(git_dir, ignore_errors=True)
        raise
    return sha


def repo_patch(
    run: CommandRunner,
    *,
    repo: Path,
    base_sha: str,
    env: dict[str, str],
    exclude: list[str],
    timeout_secs: float = 120.0,
    max_bytes: int | None = None,
) -> str:
    """The binary diff of ``repo``'s working tree against ``base_sha``.

    New files are included (``.gitignore`` honoured, see the module notes),
    paths in ``exclude`` (relative to ``repo``, e.g. materialised static
    assets) are left out, and nothing of the agent's ``.git`` is run or
    changed. A patch over ``max_bytes`` raises ``GitError``. Bytes that are
    not UTF-8 are replaced.
    """
    if not _HEX_RE.match(base_sha):
        raise GitError(f"agent patch: base commit {base_sha!r} is not a sha")
    repo = Path(repo).absolute()
    objects = repo / ".git" / "objects"
    git_dir_stat = _lstat(repo / ".git")
    if git_dir_stat is None or not stat.S_ISDIR(git_dir_stat.st_mode) or not objects.is_dir() or "\n" in str(repo):
        raise GitError(f"agent patch: {repo}/.git is missing or is not a folder")
    pathspec = ["."] + [f":(exclude,literal,top){_clean_relpath(p)}" for p in exclude]
    git = _Git(run, env, time.monotonic() + timeout_secs, timeout_secs)

    with tempfile.TemporaryDirectory(prefix=".agent-patch-", dir=repo.parent) as tmp:
        scratch = Path(tmp)
        # git may run as the sandbox uid, which owns the repository.
        _chown_like(scratch, git_dir_stat)
        out = scratch / "agent.patch"
        # Read the agent's objects, write new blobs to ours: the alternates are a file, not
        # GIT_ALTERNATE_OBJECT_DIRECTORIES, which would split a path at ":".
        git.script(
            _PATCH_SCRIPT,
            [str(scratch / "git"), str(objects), base_sha, str(out), str(repo), str(scratch / "index"), *pathspec],
            stages=_PATCH_STAGES,
            cwd=repo,
        )
        fd = os.open(out, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as patch_file:
            size = os.fstat(fd).st_size
            if max_bytes is not None and size > max_bytes:
                raise GitError(f"agent patch is {size} bytes, over the limit of {max_bytes} bytes")
            return as_text(patch_file.read())  # a NUL past git's 8000-byte look is diffed as text


class _Git:
    """Runs git commands within one step's deadline and turns failures into GitError."""

    def __init__(self, run: CommandRunner, env: dict[str, str], deadline: float, budget: float):
        self._run = run
        self._env = env
        self._deadline = deadline
        self._budget = budget

    def run(
        self,
        what: str,
        args: list[str],
        *,
        cwd: Path,
        extra_env: dict[str, str] | None = None,
        secret: str = "",
        ok_codes: tuple[int, ...] = (0,),
        bare: bool = False,
    ) -> RunResult:
        """``git <_GIT_CONFIG> <args>``, or ``args`` as they are when ``bare``."""
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise GitError(f"{what} timed out after {self._budget:g} s", transient=True)
        argv = [] if bare else git_argv()
        env = dict(self._env)
        env.update(extra_env or {})
        result = self._run([*argv, *args], cwd=cwd, env=env, timeout_secs=remaining)
        if result.timed_out:
            raise GitError(f"{what} timed out after {self._budget:g} s", transient=True)
        if result.limit_detail:
            raise GitError(f"{what} was stopped: {result.limit_detail}", limit_exceeded=True)
        if result.exit_code not in ok_codes:
            detail = git_message(result.output, secret) or f"exit status {result.exit_code}"
            raise GitError(f"{what} failed: {detail}", transient=network_trouble(result.output))
        return result

    def script(
        self,
        script: str,
        args: list[str],
        *,
        stages: dict[int, str],
        cwd: Path,
        extra_env: dict[str, str] | None = None,
        what: str = "git",
        secret: str = "",
    ) -> RunResult:
        """Run several git commands as one ``sh`` script (one command for the runner).

        The script exits with the code of the stage that failed (``stages``
        names it for the message); a code ``stages`` maps to ``""`` is the
        caller's to interpret, and the result is returned. ``what`` names the
        whole script in timeout and limit messages; ``secret`` is masked in them.
        """
        result = self.run(
            what,
            ["sh", "-c", script, "sh", *args],
            cwd=cwd,
            extra_env=extra_env,
            secret=secret,
            ok_codes=(0, *stages),
            bare=True,
        )
        stage = stages.get(result.exit_code) if result.exit_code else None
        if stage:
            detail = git_message(result.output, secret) or "no message"
            raise GitError(f"{stage} failed: {detail}", transient=network_trouble(result.output))
        return result


def _check_repo_url(repo_url: str) -> None:
    if not repo_url or repo_url.startswith("-"):
        raise GitError(f"repo {repo_url!r} is not a repository URL")
    if _has_space_or_control(repo_url):
        raise GitError(f"repo {repo_url!r} contains whitespace or control characters")
    if not _URL_RE.match(repo_url):
        # Refuses local paths (a local clone would copy alternates and
        # hardlinks), scp-like host:path, and transport helpers (ext::, fd::).
        raise GitError(f"repo {repo_url!r} is not a scheme://host/path URL")


def _check_base_commit(base_commit: str) -> None:
    if not base_commit or base_commit.startswith("-"):
        raise GitError(f"base_commit {base_commit!r} is not a commit id or ref")
    if len(base_commit) > _MAX_REF_CHARS or _has_space_or_control(base_commit):
        raise GitError(f"base_commit {base_commit!r} is not a commit id or ref")


def _has_space_or_control(text: str) -> bool:
    return any(ch.isspace() for ch in text) or _has_control(text)


def _has_control(text: str) -> bool:
    return any(unicodedata.category(ch).startswith("C") for ch in text)


def _clean_relpath(path: str) -> str:
    cleaned = path.strip("/")
    while cleaned.startswith("./"):
        cleaned = cleaned[2:]
    parts = cleaned.split("/")
    if not cleaned or os.path.isabs(path) or ".." in parts or _has_control(cleaned):
        raise GitError(f"agent patch: excluded path {path!r} is not a relative path inside the repository")
    return cleaned


def _userinfo(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    return parts.netloc.rpartition("@")[0]


def _display_url(url: str) -> str:
    """The URL without credentials, for messages."""
    secret = _userinfo(url)
    return url.replace(secret + "@", "***@", 1) if secret else url


def git_message(output: str, secret: str = "") -> str:
    """git's reason for a failure: its last non-empty line, without "fatal: "/"error: " (and ``secret``)."""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line:
            if secret:
                line = line.replace(secret, "***")
            for prefix in ("fatal: ", "error: "):
                line = line.removeprefix(prefix)
            return line
    return ""


def _chown_like(path: Path, owner: os.stat_result) -> None:
    """Give ``path`` to ``owner``'s uid when we are root and it is another uid."""
    if os.geteuid() == 0 and owner.st_uid != 0:
        os.chown(path, owner.st_uid, owner.st_gid)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except OSError:
        return None


def _last_sha(output: str) -> str | None:
    shas = [line.strip() for line in output.splitlines() if _SHA_RE.match(line.strip())]
    return shas[-1] if shas else None
