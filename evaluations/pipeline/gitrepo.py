"""Git for the pipeline: the shared git layer, and the clone at ``base_commit`` with the future hidden.

Every git command goes through a caller-supplied ``CommandRunner`` (the
project's one process spawner), so timeouts, output caps and kills are
handled there; this module only builds argv lists and reads results.

The shared layer (used by ``mirror.py`` and ``patch.py`` too): ``git_argv``
and ``sh_git`` (git with the hardening settings), ``Git`` (commands and
scripts within one deadline, failures as ``GitError``), ``git_env``, the
input checks (``check_repo_url``, ``check_base_commit``,
``check_resolve_pin``) and the readers of git's output (``git_message``,
``last_sha``, ``display_url``). The agent's patch is ``patch.py``'s.

Hiding the future (``clone_at``)
--------------------------------
The agent must not be able to read the fix: no ref, reflog entry, remote,
``FETCH_HEAD`` or object that is not an ancestor of ``base_commit``. The
one exception (SPEC §19): the tags of ``base_commit`` and its ancestors
stay, so ``git describe`` and setuptools_scm give the release's version
(without them a project versioned by its tags installs as ``0.1.devN``).
Such a tag names a commit the agent has anyway; an annotated one brings its
tag object (name, tagger, message), which names an ancestor too.

1. ``git clone --bare`` straight into ``dest/.git``: every branch is a
   plain ``refs/heads/*`` (so a branch name resolves without ``origin/``),
   a bare clone writes no reflogs and no ``branch.*`` config, and nothing is
   checked out yet;
2. resolve ``base_commit`` (short sha, branch, tag, expression) to a full
   sha with ``rev-parse`` (a full sha needs no resolving) and check that it
   names a commit;
3. list the tags it reaches with one ``for-each-ref --merged`` (``sh_past_tags``:
   one history walk for every tag; a ``merge-base --is-ancestor`` per tag
   costs a process each, 7.4 s for 2000 tags where this takes 9 ms:
   bench/RESULTS.md, issue 27);
4. delete every ref file (``packed-refs``, ``refs/``, ``logs/``) and
   ``.keep`` file with one ``rm`` (one ``update-ref -d`` per tag is slow),
   then write the listed tags back as the one ``packed-refs`` file;
5. turn the repository non-bare, drop ``remote.origin``, ``checkout
   --detach`` without a reflog and, unless the packs already hold exactly
   what HEAD and the kept tags reach (``count-objects`` against
   ``rev-list --all``), run ``git repack -a -d``, which writes one pack of
   what HEAD, the index and the tags reach and deletes the clone's packs and
   the loose objects now packed;
6. the loose objects left (dumb HTTP stores objects loose) are exactly the
   unreachable ones: they are deleted, as ``git prune`` would. The tests
   check that the stored objects are exactly those reachable from
   ``base_commit``, plus the kept tags' tag objects.

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
"""

from __future__ import annotations

import re
import shlex
import shutil
import time
import unicodedata
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

_SHA_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
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


def sh_git(*settings: str) -> str:
    """The same git prefix, as words of a shell script."""
    return " ".join(shlex.quote(word) for word in git_argv(*settings))


def sh_past_tags(where: str = "", fields: str = "%(objectname) %(refname)") -> str:
    """Shell: the tags ``$sha`` (a full commit id) reaches, as packed-refs lines ``<id> refs/tags/<name>``.

    A tag of ``$sha`` or of an ancestor is listed (an annotated tag, or a tag of a tag, by the
    commit it peels to), with the id it names itself; a tag of a later commit, of another
    history, of a tree or a blob is not. One command however many tags: ``--merged`` walks the
    history once for all of them. ``where``: git's options naming the repository
    (``--git-dir=...``), else ``$GIT_DIR``'s; ``fields``: for-each-ref's format of a line.
    """
    return f"{sh_git()} {where} for-each-ref --merged \"$sha\" --format='{fields}' refs/tags"


SH_PAST_TAGS = sh_past_tags()
# Once every ref is gone: $tags (sh_past_tags' lines, maybe none) become $GIT_DIR's packed-refs,
# one file however many tags (git sorts and peels them as it reads them).
SH_WRITE_TAGS = '[ -z "$tags" ] || printf "%s\\n" "$tags" > "$GIT_DIR/packed-refs"'


# The whole clone, in dest with GIT_DIR (dest/.git) and GIT_WORK_TREE (dest) set. $1 the URL,
# $2 base_commit, $3 "resolve" when it is not a full sha, $4 the address pin or "". A failing
# stage exits with its own code: _CLONE_STAGES names it for the message. It prints HEAD's sha last.
# Every process is an exec: one rm, and shell builtins where sed and wc were.
_NOT_A_COMMIT = 10
_BORROWS_OBJECTS = 21
_CLONE_FAILED = 20
_CLONE_SCRIPT = f"""
if [ -n "$4" ]; then
  {sh_git()} -c "http.curloptResolve=$4" clone --bare --quiet --template= -- "$1" "$GIT_DIR" || exit {_CLONE_FAILED}
else
  {sh_git()} clone --bare --quiet --template= -- "$1" "$GIT_DIR" || exit {_CLONE_FAILED}
fi
[ -e "$GIT_DIR/objects/info/alternates" ] && exit {_BORROWS_OBJECTS}
sha=$2
if [ "$3" = resolve ]; then
  sha=$({sh_git()} rev-parse --verify --quiet --end-of-options "$2^{{commit}}") || exit {_NOT_A_COMMIT}
fi
{sh_git()} cat-file -e "$sha^{{commit}}" 2>/dev/null || exit {_NOT_A_COMMIT}
tags=$({SH_PAST_TAGS}) || exit 18
# Every ref, reflog and fetch record goes (HEAD stays); refs/heads and refs/tags are made anew, for
# the agent's own branches, and the past's tags come back. A kept pack would survive the repack
# with the future in it.
cd "$GIT_DIR" || exit 22
rm -rf -- packed-refs FETCH_HEAD ORIG_HEAD logs refs objects/pack/*.keep || exit 22
mkdir -p refs/heads refs/tags || exit 22
{SH_WRITE_TAGS} || exit 19
cd "$GIT_WORK_TREE" || exit 22
counts=$({sh_git()} count-objects -v) || exit 16
loose=-1 packed=-1
while read -r key value; do
  case $key in count:) loose=$value ;; in-pack:) packed=$value ;; esac
done <<COUNTS
$counts
COUNTS
{sh_git()} config core.bare false || exit 11
{sh_git()} config --remove-section remote.origin || exit 12
{sh_git("core.logAllRefUpdates=false")} checkout --quiet --detach "$sha" -- || exit 13
# Repack unless the packs hold exactly what HEAD and the kept tags reach and nothing is loose: a
# dumb-HTTP pack or a ref ahead of the base brings the future along. Then only unreachable objects are
# left loose: deleted, as git prune would.
reached=$({sh_git()} rev-list --objects --count --all --) || exit 17
if [ "$loose" != 0 ] || [ "$reached" -ne "$packed" ]; then
  {sh_git()} repack -a -d -n -q || exit 14
  rm -rf -- "$GIT_DIR"/objects/[0-9a-f][0-9a-f] || exit 14
fi
{sh_git()} rev-parse --verify --quiet HEAD || exit 15
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
    18: "git for-each-ref --merged",
    19: "writing the tags",
    22: "removing the clone's refs",
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
    """Whether git's output says the network failed (another try may succeed), not the repository."""
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
    if resolve_pin is not None and (has_space_or_control(resolve_pin) or resolve_pin.startswith("-")):
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
    check_repo_url(repo_url)
    check_base_commit(base_commit)
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise GitError(f"clone destination {dest} is not an empty folder")
    check_resolve_pin(resolve_pin)
    shown_url = display_url(repo_url)
    git = Git(run, env, time.monotonic() + timeout_secs, timeout_secs)
    git_dir = dest / ".git"

    dest.mkdir(parents=True, exist_ok=True)
    try:
        result = git.script(
            _CLONE_SCRIPT,
            [repo_url, base_commit, "sha" if is_full_sha(base_commit) else "resolve", resolve_pin or ""],
            stages={**_CLONE_STAGES, _CLONE_FAILED: f"git clone of {shown_url}"},
            cwd=dest,
            extra_env={"GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(dest)},
            what=f"git clone of {shown_url}",
            secret=userinfo(repo_url),
        )
        if result.exit_code == _NOT_A_COMMIT:
            raise GitError(f"base_commit {base_commit} not found in {shown_url}")
        if result.exit_code == _BORROWS_OBJECTS:
            raise GitError("the clone borrows objects from another repository (alternates)")
        sha = last_sha(result.output)
        if sha is None:
            raise GitError(f"git rev-parse of HEAD failed: {git_message(result.output) or 'no sha printed'}")
    except BaseException:
        shutil.rmtree(git_dir, ignore_errors=True)
        raise
    return sha


class Git:
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


def is_full_sha(text: str) -> bool:
    """A full commit id (40 or 64 hex digits): it needs no resolving in a repository."""
    return bool(_SHA_RE.match(text))


def check_repo_url(repo_url: str) -> None:
    """Refuse, before git runs, a URL git could take as an option, a local path or a transport helper."""
    if not repo_url or repo_url.startswith("-"):
        raise GitError(f"repo {repo_url!r} is not a repository URL")
    if has_space_or_control(repo_url):
        raise GitError(f"repo {repo_url!r} contains whitespace or control characters")
    if not _URL_RE.match(repo_url):
        # Refuses local paths (a local clone would copy alternates and
        # hardlinks), scp-like host:path, and transport helpers (ext::, fd::).
        raise GitError(f"repo {repo_url!r} is not a scheme://host/path URL")


def check_base_commit(base_commit: str) -> None:
    """Refuse, before git runs, a base_commit git could take as an option or that no ref could be."""
    if not base_commit or base_commit.startswith("-"):
        raise GitError(f"base_commit {base_commit!r} is not a commit id or ref")
    if len(base_commit) > _MAX_REF_CHARS or has_space_or_control(base_commit):
        raise GitError(f"base_commit {base_commit!r} is not a commit id or ref")


def has_space_or_control(text: str) -> bool:
    """Whether ``text`` would not pass as one word of a git argument or a shell script's line."""
    return any(ch.isspace() for ch in text) or has_control(text)


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control (or other Unicode category C) character."""
    return any(unicodedata.category(ch).startswith("C") for ch in text)


def userinfo(url: str) -> str:
    """The credentials part of ``url`` (before the ``@``), to be masked in git's messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    return parts.netloc.rpartition("@")[0]


def display_url(url: str) -> str:
    """The URL without credentials, for messages."""
    secret = userinfo(url)
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


def last_sha(output: str) -> str | None:
    """The last full commit id a script printed on a line of its own (the scripts print HEAD's last)."""
    shas = [line.strip() for line in output.splitlines() if is_full_sha(line.strip())]
    return shas[-1] if shas else None
