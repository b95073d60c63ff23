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
folder is used, a throwaway index that starts at ``base_sha``, and the new
blobs written to the private object store. The agent's index, refs and
objects are neither used nor touched. The base's objects (the only ones read)
are an alternate: not the agent's ``.git/objects``, where it could write a
tree under a base tree's id (git checks the hash of a commit and its own
tree, not of the subtrees it reads, and a loose object is read as it is) and
make a changed file look unchanged, but ``keep_base_objects``'s copy, made
by the clone step before any command of the task or the agent ran, root's.
Two ``sh`` scripts (two more when the agent made a repository inside the
work tree or picked a name git refuses): one sandbox each instead of one
per git command. The second first hashes every tracked file without
writing (``update-index --refresh``), so ``add`` writes only what changed:
git "freshens" an object it would write that a pack holds by touching the
pack, which fails on root's copy, and would write each again, loose.

Nothing the agent writes decides what the patch shows (issue 23). git reads
rules from the work tree, from HOME and from the git dir; here:

- ignore rules come from the base commit's tree only. The first script
  writes out the base's ``.gitignore`` files; ``_base_rules`` turns them into
  one excludes file (each pattern anchored to its folder), and the new files
  are listed with ``ls-files --others --exclude-from`` that file alone, then
  added with ``update-index --add`` (which no ignore rule stops, and which
  never stores a folder, so never a gitlink). A folder holding a repository
  of the agent's (a ``.git`` folder or file) is listed by git as the folder:
  ``_new_files`` lists its files with a walk that follows no link and leaves
  out every ``.git`` (git metadata: not in the patch), and ``check-ignore
  --no-index`` with the same excludes file, in an empty work tree (so no
  ``.gitignore`` of the agent's), drops those the base ignores. Names git
  refuses to store (a ``.git`` component in any case, a link named
  ``.gitmodules``) are left out instead of failing the whole patch, and
  ``core.protectNTFS``/``protectHFS`` are off (a backslash is a plain
  character on Linux). A ``.gitignore`` the agent adds or edits hides
  nothing (its own change is in the patch). Build junk the base ignores
  (``node_modules/``, ``__pycache__/``) stays out, tracked files that match
  an ignore rule are still diffed;
- attributes likewise: the private git dir's ``info/attributes``, which
  outranks every ``.gitattributes`` in the work tree, first unsets every
  attribute that changes what ``git add`` stores or how ``diff`` shows it
  (``-diff``/``binary``, ``filter``, ``text``/``eol``, ``ident``,
  ``working-tree-encoding``), then gives back the base's own;
- no global or system config (``GIT_CONFIG_GLOBAL``/``SYSTEM``), no global
  excludes or attributes file (``core.excludesFile``/``attributesFile`` are
  ``/dev/null``, and HOME and ``XDG_CONFIG_HOME`` an empty scratch folder:
  the agent's ``~/.config/git/ignore`` is never read), no ``info/exclude``
  (the private git dir has none).

Renames are written as deletion plus addition (``--no-renames``), so text
changes also apply with ``patch -p1``; binary files need ``git apply``.
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
from evaluations.safefs import copy_tree_nofollow, write_file_nofollow

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

# The agent patch takes two scripts (four: see _PATCH_NEEDS_LISTING), all with a private git dir, the base's objects (the copy
# keep_base_objects made at clone time, never the agent's object store) as read-only alternates
# and a throwaway index. The first ($1 private git dir, $2 the base's objects, $3 base sha, $4 the
# index, $5 the work tree, $6 the attributes that switch every conversion off, $7 where the base's
# rule files go, $8 their list, $9 the scratch folder, for stage.base: the index) reads the base tree and writes out the
# .gitignore and .gitattributes files it holds, as the base commit has them.
_PATCH_SETTINGS = (
    "core.bare=false",
    "core.filemode=true",
    "core.symlinks=true",
    "core.excludesFile=/dev/null",  # no excludes file but the base's rules (the default is in HOME)
    "core.attributesFile=/dev/null",
    "core.protectNTFS=false",  # a name git refuses would fail the whole add: only `.git` is refused
    "core.protectHFS=false",
)
_PATCH_BASE_SCRIPT = f"""
{_sh_git()} init --quiet --bare --template= -- "$1" || exit 10
printf '%s\\n' "$2" > "$1/objects/info/alternates" || exit 11
mkdir "$1/info" && printf '%s\\n' "$6" > "$1/info/attributes" || exit 11
export GIT_DIR="$1" GIT_WORK_TREE="$5" GIT_INDEX_FILE="$4" GIT_OPTIONAL_LOCKS=0
{_sh_git(*_PATCH_SETTINGS)} read-tree "$3" || exit 12
{_sh_git(*_PATCH_SETTINGS)} ls-files -z -- ':(top,glob)**/.gitignore' ':(top,glob)**/.gitattributes' > "$8" || exit 15
{_sh_git(*_PATCH_SETTINGS)} checkout-index -z --stdin "--prefix=$7/" < "$8" || exit 16
{_sh_git(*_PATCH_SETTINGS)} ls-files -z --stage > "$9/stage.base" || exit 15
"""
# The tracked files as they are now, the new files that the base's rules do not ignore (the work
# tree's .gitignore files are not read: --exclude-from alone), then the diff: $new added, the
# gitlinks in $links removed. update-index adds a path as the file or link it is, never a folder,
# so never a gitlink, and no ignore rule stops it. $1/info/attributes holds the base's attributes.
_PATCH_ADD_AND_DIFF = f"""
if [ -s "$links" ]; then
  {_sh_git(*_PATCH_SETTINGS)} update-index --force-remove -z --stdin < "$links" || exit 13
fi
if [ -s "$new" ]; then
  {_sh_git(*_PATCH_SETTINGS)} update-index --add --replace -z --stdin < "$new" || exit 13
fi
{_sh_git(*_PATCH_SETTINGS)} diff --cached --binary --no-renames --no-ext-diff --no-textconv --no-color \\
    --src-prefix=a/ --dst-prefix=b/ "--output=$s/agent.patch" "$base" -- "$@" || exit 14
"""
# The second ($1 private git dir, $2 the work tree, $3 the index, $4 the scratch folder with the
# base's ignore rules and index (base.gitignore, stage.base), $5 base sha, then the pathspec).
# The refresh hashes every tracked file without writing it, so `add --update` writes only what
# changed (git "freshens" an object it would write that an alternate's pack holds by touching the
# pack; the base's packs are root's, so each would be written again, loose, instead). Then the
# new files, and the diff, unless the agent made a repository inside the work tree or picked a
# name git refuses: git lists such a folder (a `.git` folder or file in it) as the folder, with a
# trailing slash, and `add --update` stages a tracked file replaced by one as a gitlink. Then it
# exits _PATCH_NEEDS_LISTING and repo_patch lists those files itself.
_PATCH_NEEDS_LISTING = 30
_PATCH_LIST_SCRIPT = f"""
export GIT_DIR="$1" GIT_WORK_TREE="$2" GIT_INDEX_FILE="$3" GIT_OPTIONAL_LOCKS=0
s=$4 base=$5
shift 5
{_sh_git(*_PATCH_SETTINGS)} update-index -q --refresh > /dev/null || exit 13
{_sh_git(*_PATCH_SETTINGS)} add --update -- "$@" || exit 13
{_sh_git(*_PATCH_SETTINGS)} ls-files -z --stage -- "$@" > "$s/stage.now" || exit 15
{_sh_git(*_PATCH_SETTINGS)} ls-files -z --others "--exclude-from=$s/base.gitignore" -- "$@" > "$s/others" || exit 15
grep -z '^160000 ' "$s/stage.base" > "$s/links.base"; [ $? -le 1 ] || exit 18
grep -z '^160000 ' "$s/stage.now" > "$s/links.now"; [ $? -le 1 ] || exit 18
grep -qziE '/$|(^|/)[.]git(/|$)|(^|/)[.]gitmodules$' "$s/others"; found=$?
[ $found -le 1 ] || exit 18
cmp -s "$s/links.base" "$s/links.now" && [ $found = 1 ] || exit {_PATCH_NEEDS_LISTING}
new=$s/others links=/dev/null
{_PATCH_ADD_AND_DIFF}"""
# Only when a folder holds a repository ($1 private git dir, $2 an empty work tree, $3 the base's
# ignore rules, $4 the files found in such folders, $5 those the rules ignore): the base's rules
# alone, as an excludes file, in a work tree with no .gitignore file (exit 1: none ignored).
_PATCH_IGNORED_SCRIPT = f"""
export GIT_DIR="$1" GIT_WORK_TREE="$2" GIT_OPTIONAL_LOCKS=0
{_sh_git(*_PATCH_SETTINGS)} -c "core.excludesFile=$3" check-ignore --no-index -z --stdin < "$4" > "$5" || \\
  [ $? = 1 ] || exit 17
"""
# After _PATCH_NEEDS_LISTING (the same arguments): the files repo_patch listed (new.list) added,
# the gitlinks `add --update` made (links) removed, and the diff.
_PATCH_SCRIPT = f"""
export GIT_DIR="$1" GIT_WORK_TREE="$2" GIT_INDEX_FILE="$3" GIT_OPTIONAL_LOCKS=0
s=$4 base=$5
shift 5
new=$s/new.list links=$s/links
{_PATCH_ADD_AND_DIFF}"""
_PATCH_STAGES = {
    10: "git init",
    11: "writing the private git dir's alternates and attributes",
    12: "git read-tree of the base commit",
    13: "git add of the working tree",
    14: "git diff",
    15: "git ls-files",
    16: "git checkout-index of the base's .gitignore and .gitattributes files",
    17: "git check-ignore",
    18: "reading the lists of new files and gitlinks",
    _PATCH_NEEDS_LISTING: "",
}
# What changes how `git add` stores a file or how `git diff` shows it, unset for every path; only
# the base commit's .gitattributes (after this line, see _base_rules) set them again. The
# private git dir's info/attributes outranks every .gitattributes file in the work tree.
_ATTRIBUTES_RESET = "* !text !eol !crlf !filter !diff !ident !working-tree-encoding !binary"


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


def keep_base_objects(repo: Path, dest: Path) -> None:
    """Copy the object store of a fresh clone (``repo/.git/objects``) to the new folder ``dest``.

    Call right after the clone, before any command of the task or the agent runs: the copy is
    the caller's (root's, outside every folder the agent may write), and ``repo_patch`` reads the
    base commit's trees from it. The agent owns ``repo/.git``: git does not check the hash of
    the subtrees it reads, so objects the agent wrote there under the base's ids would make a
    changed file look unchanged. Links are not followed; the clone has no alternates.
    """
    objects = Path(repo) / ".git" / "objects"
    found = _lstat(objects)
    if found is None or not stat.S_ISDIR(found.st_mode):
        raise OSError(f"{objects} is missing or is not a folder")
    copy_tree_nofollow(objects, dest, None)


def repo_patch(
    run: CommandRunner,
    *,
    repo: Path,
    base_sha: str,
    base_objects: Path,
    env: dict[str, str],
    exclude: list[str],
    timeout_secs: float = 120.0,
    max_bytes: int | None = None,
) -> str:
    """The binary diff of ``repo``'s working tree against ``base_sha``.

    The base commit's objects are read from ``base_objects`` (``keep_base_objects``'s copy),
    never from the agent's ``.git``, which is neither run, read nor changed. New files are
    included unless the base commit's ``.gitignore`` files ignore them (see the module notes),
    also inside a repository the agent made in the work tree (as plain files; its ``.git`` is
    left out), paths in ``exclude`` (relative to ``repo``, e.g. materialised static
    assets) are left out. git gets ``env`` with HOME and ``XDG_CONFIG_HOME`` replaced by
    an empty folder of its own. A patch over ``max_bytes`` raises ``GitError``. Bytes that are
    not UTF-8 are replaced.
    """
    if not _HEX_RE.match(base_sha):
        raise GitError(f"agent patch: base commit {base_sha!r} is not a sha")
    repo = Path(repo).absolute()
    base_objects = Path(base_objects).absolute()
    repo_stat, objects_stat = _lstat(repo), _lstat(base_objects)
    if repo_stat is None or not stat.S_ISDIR(repo_stat.st_mode) or "\n" in str(repo):
        raise GitError(f"agent patch: {repo} is missing or is not a folder")
    if objects_stat is None or not stat.S_ISDIR(objects_stat.st_mode) or "\n" in str(base_objects):
        raise GitError(f"agent patch: the base's objects {base_objects} are missing")
    pathspec = ["."] + [f":(exclude,literal,top){_clean_relpath(p)}" for p in exclude]
    git = _Git(run, env, time.monotonic() + timeout_secs, timeout_secs)

    with tempfile.TemporaryDirectory(prefix=".agent-patch-", dir=repo.parent) as tmp:
        scratch = Path(tmp)
        home = scratch / "home"  # git's HOME: empty, nothing of the agent's (its own HOME is theirs)
        empty = scratch / "empty"  # the work tree check-ignore sees: no .gitignore file in it
        for folder in (scratch, home, empty):
            folder.mkdir(exist_ok=True)
            _chown_like(folder, repo_stat)  # git may run as the sandbox uid, which owns the repository
        git_dir, index, rules, listed = scratch / "git", scratch / "index", scratch / "rules", scratch / "rules.list"
        no_home = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
        git.script(
            _PATCH_BASE_SCRIPT,
            [
                str(git_dir),
                str(base_objects),
                base_sha,
                str(index),
                str(repo),
                _ATTRIBUTES_RESET,
                str(rules),
                str(listed),
                str(scratch),
            ],
            stages=_PATCH_STAGES,
            cwd=repo,
            extra_env=no_home,
        )
        ignore_rules, attributes = _base_rules(rules, _read_nofollow(listed))
        write_file_nofollow(scratch, "git/info/attributes", f"{_ATTRIBUTES_RESET}\n{attributes}".encode(_FS, _ESC))
        write_file_nofollow(scratch, "base.gitignore", ignore_rules.encode(_FS, _ESC))
        args = [str(git_dir), str(repo), str(index), str(scratch), base_sha, *pathspec]
        result = git.script(_PATCH_LIST_SCRIPT, args, stages=_PATCH_STAGES, cwd=repo, extra_env=no_home)
        if result.exit_code == _PATCH_NEEDS_LISTING:
            _list_new_files(git, repo, scratch, git_dir, empty, no_home)
            git.script(_PATCH_SCRIPT, args, stages=_PATCH_STAGES, cwd=repo, extra_env=no_home)
        out = scratch / "agent.patch"
        fd = os.open(out, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as patch_file:
            size = os.fstat(fd).st_size
            if max_bytes is not None and size > max_bytes:
                raise GitError(f"agent patch is {size} bytes, over the limit of {max_bytes} bytes")
            return as_text(patch_file.read())  # a NUL past git's 8000-byte look is diffed as text


def _list_new_files(git: _Git, repo: Path, scratch: Path, git_dir: Path, empty: Path, env: dict) -> None:
    """Write ``scratch/new.list`` (the new files to add) and ``scratch/links`` (the gitlinks to
    remove) when the agent made a repository inside the work tree or picked a name git refuses."""
    new, nested = _new_files(repo, _read_nofollow(scratch / "others"))
    # a tracked file the agent replaced by a repository of its own: its files, never a gitlink
    links = sorted(_gitlinks(_read_nofollow(scratch / "stage.now")) - _gitlinks(_read_nofollow(scratch / "stage.base")))
    for link in links:
        nested += _walk_files(repo, link)
    if nested:  # files in a repository of the agent's: the base's rules decide, as for the rest
        write_file_nofollow(scratch, "nested", b"".join(path + b"\0" for path in nested))
        git.script(
            _PATCH_IGNORED_SCRIPT,
            [str(git_dir), str(empty), str(scratch / "base.gitignore"), str(scratch / "nested"), str(scratch / "ign")],
            stages=_PATCH_STAGES,
            cwd=empty,
            extra_env=env,
        )
        ignored = set(_read_nofollow(scratch / "ign").split(b"\0"))
        new += [path for path in nested if path not in ignored]
    write_file_nofollow(scratch, "new.list", b"".join(path + b"\0" for path in new))
    write_file_nofollow(scratch, "links", b"".join(path + b"\0" for path in links))


def _new_files(repo: Path, listing: bytes) -> tuple[list[bytes], list[bytes]]:
    """``ls-files --others`` output as (the files git can store, the files inside repositories).

    git lists a folder holding a repository of its own (a ``.git`` folder or file) as the folder;
    its files are listed here, by a walk that follows no link and leaves out every ``.git``.
    Names git refuses to store (a ``.git`` in any case, a link named ``.gitmodules``) are left
    out, so no name the agent picks fails the whole patch.
    """
    new, nested = [], []
    for path in listing.split(b"\0"):
        if path.endswith(b"/"):
            nested += _walk_files(repo, path.rstrip(b"/"))
        elif path and _storable(repo, path):
            new.append(path)
    return new, nested


def _gitlinks(stage: bytes) -> set[bytes]:
    """The paths of the gitlinks in ``ls-files -z --stage`` output."""
    return {entry.partition(b"\t")[2] for entry in stage.split(b"\0") if entry.startswith(b"160000 ")}


def _walk_files(repo: Path, top: bytes) -> list[bytes]:
    found, folders = [], [top]
    while folders:
        folder = folders.pop()
        try:
            entries = list(os.scandir(os.path.join(os.fsencode(repo), folder)))
        except OSError:
            continue  # gone or unreadable: git would not list it either
        for entry in entries:
            if entry.name.lower() == b".git":
                continue  # git metadata, never stored (git refuses the name)
            path = folder + b"/" + entry.name
            if entry.is_dir(follow_symlinks=False):
                folders.append(path)
            elif (entry.is_file(follow_symlinks=False) or entry.is_symlink()) and _storable(repo, path):
                found.append(path)
    return sorted(found)


def _storable(repo: Path, path: bytes) -> bool:
    """Whether git accepts ``path`` in an index (core.protectNTFS and protectHFS off)."""
    if any(part.lower() == b".git" for part in path.split(b"/")):
        return False
    if path.rpartition(b"/")[2].lower() == b".gitmodules":
        mode = _lstat(Path(os.fsdecode(os.path.join(os.fsencode(repo), path))))
        return mode is not None and not stat.S_ISLNK(mode.st_mode)
    return True


# The base's rule files: bytes that are not UTF-8 pass through unchanged.
_FS, _ESC = "utf-8", "surrogateescape"
_GLOB_SPECIAL = frozenset("\\*?[!#")
_FIRST_WORD = re.compile(r"(\S+)(.*)", re.DOTALL)
_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"'}


def _base_rules(rules: Path, listing: bytes) -> tuple[str, str]:
    """The base commit's .gitignore and .gitattributes files as one excludes file and one
    info/attributes file, each pattern anchored to the folder of the file it came from.

    git reads these per-directory files from the work tree, where the agent can add, edit or
    remove them; the patch reads them from the base tree only (``_PATCH_BASE_SCRIPT`` wrote them
    to ``rules``). A parent's file comes before its children's, so a deeper rule wins, as in git.
    """
    ignore, attributes = [], []
    for relpath in sorted(os.fsdecode(name) for name in listing.split(b"\0") if name):
        folder, _, name = relpath.rpartition("/")
        try:
            text = _read_nofollow(rules / relpath).decode(_FS, _ESC)
        except OSError:
            continue  # a link in the base tree: git does not follow one either
        lines = text.removeprefix("\ufeff").split("\n")
        if name == ".gitignore":
            ignore += filter(None, (_ignore_line(folder, line.removesuffix("\r")) for line in lines))
        else:
            attributes += filter(None, (_attributes_line(folder, line) for line in lines))
    return "".join(f"{line}\n" for line in ignore), "".join(f"{line}\n" for line in attributes)


def _ignore_line(folder: str, line: str) -> str | None:
    """A .gitignore line of ``folder`` as a line of an excludes file read at the top."""
    while line.endswith(" ") and not line.endswith("\\ "):
        line = line[:-1]  # git drops trailing spaces that are not escaped
    if not line or line.startswith("#"):
        return None
    negated = line.startswith("!")
    pattern = line[1:] if negated else line
    return ("!" if negated else "") + _anchored(folder, pattern)


def _attributes_line(folder: str, line: str) -> str | None:
    """A .gitattributes line of ``folder`` as a line of info/attributes (patterns C-quoted)."""
    line = line.lstrip(" \t\r\f\v")
    if not line or line.startswith("#"):
        return None
    if line.startswith("[attr]"):
        return None if folder else line  # macros count only in the top-level file
    if line.startswith('"'):
        pattern, rest = _c_unquote(line)
        if pattern is None:
            return None  # git ignores a line it cannot unquote
    else:
        pattern, rest = _FIRST_WORD.match(line).groups()
    if pattern.startswith("!"):
        return None  # negative patterns are not allowed: git ignores the line
    return _c_quote(_anchored(folder, pattern)) + rest


def _anchored(folder: str, pattern: str) -> str:
    """``pattern`` of a rule file in ``folder`` as a pattern relative to the top.

    With a slash (other than a trailing one) it is relative to ``folder``; without, it matches
    a name at any depth below ``folder``.
    """
    if not folder:
        return pattern
    prefix = "".join("\\" + ch if ch in _GLOB_SPECIAL else ch for ch in folder)
    if "/" in pattern.removesuffix("/"):
        return f"{prefix}/{pattern.removeprefix('/')}"
    return f"{prefix}/**/{pattern}"


def _c_quote(text: str) -> str:
    quoted = "".join(
        "\\" + ch if ch in '"\\' else f"\\{ord(ch):03o}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch for ch in text
    )
    return f'"{quoted}"'


def _c_unquote(line: str) -> tuple[str | None, str]:
    """The C-quoted pattern that starts ``line`` and what follows it; (None, "") if malformed."""
    out, i = [], 1
    while i < len(line):
        ch = line[i]
        if ch == '"':
            return "".join(out), line[i + 1 :]
        if ch == "\\" and i + 1 < len(line):
            nxt = line[i + 1]
            if nxt in _C_ESCAPES:
                out.append(_C_ESCAPES[nxt])
                i += 2
                continue
            if line[i + 1 : i + 4].isdigit() and len(line[i + 1 : i + 4]) == 3:
                out.append(bytes([int(line[i + 1 : i + 4], 8) & 0xFF]).decode(_FS, _ESC))
                i += 4
                continue
            return None, ""
        out.append(ch)
        i += 1
    return None, ""


def _read_nofollow(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


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
