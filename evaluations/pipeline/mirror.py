"""A bare mirror per repository URL, and an evaluation's repository fetched from it (SPEC §13).

The mirror holds the future (every branch and tag, fetched whenever a task
needs a commit it lacks). The evaluation must not see it, so the repository
it gets is never a clone sharing the mirror's objects (``--reference``,
``--shared`` and ``objects/info/alternates`` would all let ``git cat-file``
read later commits): it is a fresh ``git init`` into which ``base_commit``
and the tag objects of the tags it reaches (``gitrepo.sh_past_tags``, listed
in the mirror) are fetched by id; those tags are then written as its
``packed-refs``, as ``clone_at`` writes them. A fetch over the pack protocol
sends exactly the objects reachable from what is asked, even from a local
mirror, so the result holds the same objects and tags as ``gitrepo.clone_at``
leaves, and the same hardening applies (hooks off, no template, no remote,
no reflog, ``FETCH_HEAD`` not written). A tag of a later commit, however
near, stays in the mirror.

These functions only run git (through the caller's ``CommandRunner``, the
one spawner); who may write the mirror and when is pipeline/warm.py's job
(``WorkspaceCache``).
"""

from __future__ import annotations

import time
from pathlib import Path

from evaluations.pipeline.gitrepo import (
    SH_WRITE_TAGS,
    CommandRunner,
    Git,
    GitError,
    check_base_commit,
    check_repo_url,
    check_resolve_pin,
    display_url,
    git_message,
    has_space_or_control,
    is_full_sha,
    last_sha,
    sh_git,
    sh_past_tags,
    userinfo,
)
from evaluations.safefs import remove_tree_nofollow

_MISSING = 10
_FETCH_FAILED = 20

# $1 the mirror, $2 the URL, $3 the address pin or "". Every branch and tag, pruned: a deleted
# branch must not keep resolving. No tags beyond those (no refs/pull/*): what a clone would get.
_UPDATE_SCRIPT = f"""
[ -f "$1/HEAD" ] || {sh_git()} init --quiet --bare --template= -- "$1" || exit 11
if [ -n "$3" ]; then
  {sh_git()} -c "http.curloptResolve=$3" --git-dir="$1" fetch --quiet --prune --no-write-fetch-head -- "$2" \\
    '+refs/heads/*:refs/heads/*' '+refs/tags/*:refs/tags/*' || exit {_FETCH_FAILED}
else
  {sh_git()} --git-dir="$1" fetch --quiet --prune --no-write-fetch-head -- "$2" \\
    '+refs/heads/*:refs/heads/*' '+refs/tags/*:refs/tags/*' || exit {_FETCH_FAILED}
fi
"""

# $1 the mirror, $2 base_commit, $3 "resolve" when it is not a full sha, $4 "resolve-only" to stop at
# the sha. GIT_DIR/GIT_WORK_TREE are the evaluation's repository. Prints the sha last.
_CLONE_SCRIPT = f"""
[ -f "$1/HEAD" ] || exit {_MISSING}
sha=$2
if [ "$3" = resolve ]; then
  sha=$({sh_git()} --git-dir="$1" rev-parse --verify --quiet --end-of-options "$2^{{commit}}") || exit {_MISSING}
fi
{sh_git()} --git-dir="$1" cat-file -e "$sha^{{commit}}" 2>/dev/null || exit {_MISSING}
if [ "$4" = resolve-only ]; then printf '%s\n' "$sha"; exit 0; fi
tags=$({sh_past_tags('--git-dir="$1"')}) || exit 17
wants=$({sh_past_tags('--git-dir="$1"', "%(objectname)")}) || exit 17
{sh_git()} init --quiet --template= -- "$GIT_WORK_TREE" || exit 12
# The base and what its tags name (their tag objects), asked for by id: no ref of the mirror is copied.
# Never an empty line: fetch takes one for the mirror's HEAD, the future.
{{ printf '%s\n' "$sha"; [ -z "$wants" ] || printf '%s\n' "$wants"; }} |
  {sh_git("uploadpack.allowAnySHA1InWant=true")} fetch --quiet --no-tags --no-write-fetch-head --stdin \\
    -- "file://$1" || exit 13
[ -e "$GIT_DIR/objects/info/alternates" ] && exit 14
{SH_WRITE_TAGS} || exit 18
{sh_git("core.logAllRefUpdates=false")} checkout --quiet --detach "$sha" -- || exit 15
{sh_git()} rev-parse --verify --quiet HEAD || exit 16
"""
_CLONE_STAGES = {
    _MISSING: "",
    12: "git init",
    13: "git fetch from the mirror",
    14: "checking for alternates",
    15: "git checkout",
    16: "git rev-parse of HEAD",
    17: "git for-each-ref --merged in the mirror",
    18: "writing the tags",
}


class NotInMirror(GitError):
    """The mirror does not hold ``base_commit`` (yet)."""


def update_mirror(
    run: CommandRunner,
    *,
    mirror: Path,
    repo_url: str,
    env: dict[str, str],
    timeout_secs: float,
    resolve_pin: str | None = None,
) -> None:
    """Create the bare mirror at ``mirror`` if needed and fetch every branch and tag of ``repo_url``."""
    check_repo_url(repo_url)
    check_resolve_pin(resolve_pin)
    shown = display_url(repo_url)
    git = Git(run, env, time.monotonic() + timeout_secs, timeout_secs)
    git.script(
        _UPDATE_SCRIPT,
        [str(mirror), repo_url, resolve_pin or ""],
        stages={11: "git init of the mirror", _FETCH_FAILED: f"git fetch of {shown}"},
        cwd=mirror.parent,
        what=f"git fetch of {shown}",
        secret=userinfo(repo_url),
    )


def clone_from_mirror(
    run: CommandRunner,
    *,
    mirror: Path,
    base_commit: str,
    dest: Path,
    env: dict[str, str],
    timeout_secs: float,
) -> str:
    """A fresh repository in ``dest`` at ``base_commit`` with its history and nothing later; its sha.

    NotInMirror when the mirror lacks the commit; ``dest`` is then left empty.
    ``env`` must allow the file protocol (the mirror is fetched from as ``file://``).
    """
    check_base_commit(base_commit)
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise GitError(f"clone destination {dest} is not an empty folder")
    if has_space_or_control(str(mirror)):
        raise GitError(f"mirror path {mirror} holds whitespace")
    git = Git(run, env, time.monotonic() + timeout_secs, timeout_secs)
    git_dir = dest / ".git"
    dest.mkdir(parents=True, exist_ok=True)
    try:
        result = git.script(
            _CLONE_SCRIPT,
            [str(mirror), base_commit, "sha" if is_full_sha(base_commit) else "resolve", "clone"],
            stages=_CLONE_STAGES,
            cwd=dest,
            extra_env={"GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(dest)},
            what="git clone from the mirror",
        )
        if result.exit_code == _MISSING:
            raise NotInMirror(f"base_commit {base_commit} is not in the mirror")
        sha = last_sha(result.output)
        if sha is None:
            raise GitError(f"git rev-parse of HEAD failed: {git_message(result.output) or 'no sha printed'}")
    except BaseException:
        _empty(dest)
        raise
    return sha


def resolve_in_mirror(
    run: CommandRunner, *, mirror: Path, base_commit: str, env: dict[str, str], timeout_secs: float
) -> str:
    """The full sha ``base_commit`` names in the mirror (NotInMirror if none), without cloning."""
    check_base_commit(base_commit)
    git = Git(run, env, time.monotonic() + timeout_secs, timeout_secs)
    result = git.script(
        _CLONE_SCRIPT,
        [str(mirror), base_commit, "sha" if is_full_sha(base_commit) else "resolve", "resolve-only"],
        stages=_CLONE_STAGES,
        cwd=mirror.parent,
        what="git rev-parse in the mirror",
    )
    sha = last_sha(result.output) if result.exit_code == 0 else None
    if sha is None:
        raise NotInMirror(f"base_commit {base_commit} is not in the mirror")
    return sha


def names_a_commit_forever(base_commit: str) -> bool:
    """A hex id names the same commit wherever it is found; a branch or tag may have moved since."""
    return all(ch in "0123456789abcdef" for ch in base_commit) and 4 <= len(base_commit) <= 64


def _empty(dest: Path) -> None:
    for child in list(dest.iterdir()) if dest.is_dir() else []:
        remove_tree_nofollow(child)
