"""The agent's patch (``repo_patch``): its work tree against the base commit, with git it cannot steer.

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
import stat
import tempfile
import time
from pathlib import Path

from evaluations.pipeline.gitrepo import CommandRunner, Git, GitError, has_control, sh_git
from evaluations.runtime.output import as_text
from evaluations.safefs import copy_tree_nofollow, write_file_nofollow

_HEX_RE = re.compile(r"^[0-9a-f]{4,64}$")


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
{sh_git()} init --quiet --bare --template= -- "$1" || exit 10
printf '%s\\n' "$2" > "$1/objects/info/alternates" || exit 11
printf '%s\\n' "$6" > "$1/info/attributes" || exit 11
export GIT_DIR="$1" GIT_WORK_TREE="$5" GIT_INDEX_FILE="$4" GIT_OPTIONAL_LOCKS=0
{sh_git(*_PATCH_SETTINGS)} read-tree "$3" || exit 12
{sh_git(*_PATCH_SETTINGS)} ls-files -z -- ':(top,glob)**/.gitignore' ':(top,glob)**/.gitattributes' > "$8" || exit 15
{sh_git(*_PATCH_SETTINGS)} checkout-index -z --stdin "--prefix=$7/" < "$8" || exit 16
{sh_git(*_PATCH_SETTINGS)} ls-files -z --stage > "$9/stage.base" || exit 15
"""
# The second ($1 private git dir, $2 the work tree, $3 the index, $4 the scratch folder with the
# base's ignore rules and index (base.gitignore, stage.base), $5 base sha, then the pathspec).
# The refresh hashes every tracked file without writing it, so `add --update` writes only what
# changed (git "freshens" an object it would write that an alternate's pack holds by touching the
# pack; the base's packs are root's, so each would be written again, loose, instead). Then the
# new files, listed before they are added, and the diff. Unless the agent made a repository inside
# the work tree or picked a name git refuses: git lists such a folder (a `.git` folder or file in
# it) as the folder, with a trailing slash, which `update-index --add` refuses (exit
# _PATCH_NEEDS_LISTING), and `add --update` stages a tracked file replaced by one as a gitlink;
# ``_needs_listing`` reads the two lists for both (no process of its own), and repo_patch then
# lists those files itself and makes the diff again (_PATCH_SCRIPT).
_PATCH_NEEDS_LISTING = 30
_PATCH_LIST_SCRIPT = f"""
export GIT_DIR="$1" GIT_WORK_TREE="$2" GIT_INDEX_FILE="$3" GIT_OPTIONAL_LOCKS=0
s=$4 base=$5
shift 5
{sh_git(*_PATCH_SETTINGS)} update-index -q --refresh > /dev/null || exit 13
{sh_git(*_PATCH_SETTINGS)} add --update -- "$@" || exit 13
{sh_git(*_PATCH_SETTINGS)} ls-files -z --stage -- "$@" > "$s/stage.now" || exit 15
{sh_git(*_PATCH_SETTINGS)} ls-files -z --others "--exclude-from=$s/base.gitignore" -- "$@" > "$s/others" || exit 15
if [ -s "$s/others" ]; then
  {sh_git(*_PATCH_SETTINGS)} update-index --add --replace -z --stdin < "$s/others" || exit {_PATCH_NEEDS_LISTING}
fi
{sh_git(*_PATCH_SETTINGS)} diff --cached --binary --no-renames --no-ext-diff --no-textconv --no-color \\
    --src-prefix=a/ --dst-prefix=b/ "--output=$s/agent.patch" "$base" -- "$@" || exit 14
"""
# Only when a folder holds a repository ($1 private git dir, $2 an empty work tree, $3 the base's
# ignore rules, $4 the files found in such folders, $5 those the rules ignore): the base's rules
# alone, as an excludes file, in a work tree with no .gitignore file (exit 1: none ignored).
_PATCH_IGNORED_SCRIPT = f"""
export GIT_DIR="$1" GIT_WORK_TREE="$2" GIT_OPTIONAL_LOCKS=0
{sh_git(*_PATCH_SETTINGS)} -c "core.excludesFile=$3" check-ignore --no-index -z --stdin < "$4" > "$5" || \\
  [ $? = 1 ] || exit 17
"""
# After _PATCH_NEEDS_LISTING (the same arguments): the index made again from the base (the list
# script may have added what the listing leaves out), the tracked files as they are now, then the
# files repo_patch listed (new.list) added, the gitlinks `add --update` made (links) removed, and
# the diff.
_PATCH_SCRIPT = f"""
export GIT_DIR="$1" GIT_WORK_TREE="$2" GIT_INDEX_FILE="$3" GIT_OPTIONAL_LOCKS=0
s=$4 base=$5
shift 5
{sh_git(*_PATCH_SETTINGS)} read-tree "$base" || exit 12
{sh_git(*_PATCH_SETTINGS)} update-index -q --refresh > /dev/null || exit 13
{sh_git(*_PATCH_SETTINGS)} add --update -- "$@" || exit 13
if [ -s "$s/links" ]; then
  {sh_git(*_PATCH_SETTINGS)} update-index --force-remove -z --stdin < "$s/links" || exit 13
fi
if [ -s "$s/new.list" ]; then
  {sh_git(*_PATCH_SETTINGS)} update-index --add --replace -z --stdin < "$s/new.list" || exit 13
fi
{sh_git(*_PATCH_SETTINGS)} diff --cached --binary --no-renames --no-ext-diff --no-textconv --no-color \\
    --src-prefix=a/ --dst-prefix=b/ "--output=$s/agent.patch" "$base" -- "$@" || exit 14
"""
_PATCH_STAGES = {
    10: "git init",
    11: "writing the private git dir's alternates and attributes",
    12: "git read-tree of the base commit",
    13: "git add of the working tree",
    14: "git diff",
    15: "git ls-files",
    16: "git checkout-index of the base's .gitignore and .gitattributes files",
    17: "git check-ignore",
    _PATCH_NEEDS_LISTING: "",
}
# What changes how `git add` stores a file or how `git diff` shows it, unset for every path; only
# the base commit's .gitattributes (after this line, see _base_rules) set them again. The
# private git dir's info/attributes outranks every .gitattributes file in the work tree.
_ATTRIBUTES_RESET = "* !text !eol !crlf !filter !diff !ident !working-tree-encoding !binary"


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


class PatchBase:
    """What the patch reads of the base commit (``read_base``), in a scratch folder of its own (in the
    session, beside the repository: never in a folder the agent's sandbox binds): the private git
    dir with the base's objects as alternates and its attributes, the index at the base, the base's
    ignore rules and its ``ls-files --stage``. ``remove`` once the patch is made (``repo_patch`` does)."""

    def __init__(self, scratch: tempfile.TemporaryDirectory, repo: Path, base_sha: str, base_objects: Path):
        self._scratch = scratch
        self.scratch = Path(scratch.name)
        self.repo, self.base_sha, self.base_objects = repo, base_sha, base_objects
        self.git_dir, self.index = self.scratch / "git", self.scratch / "index"
        self.home = self.scratch / "home"  # git's HOME: empty, nothing of the agent's (its own HOME is theirs)
        self.empty = self.scratch / "empty"  # the work tree check-ignore sees: no .gitignore file in it

    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), "XDG_CONFIG_HOME": str(self.home / ".config")}

    def made_for(self, repo: Path, base_sha: str, base_objects: Path) -> bool:
        return (self.repo, self.base_sha, self.base_objects) == (
            Path(repo).absolute(),
            base_sha,
            Path(base_objects).absolute(),
        )

    def remove(self) -> None:
        self._scratch.cleanup()


def read_base(
    run: CommandRunner,
    *,
    repo: Path,
    base_sha: str,
    base_objects: Path,
    env: dict[str, str],
    timeout_secs: float = 120.0,
) -> PatchBase:
    """``repo_patch``'s first script and the base's rules: what it reads of the base commit. It
    reads only ``base_objects`` (root's copy, made at clone time) and writes only its own scratch
    folder (the index at the base is never checked out), so it may run before the agent's end,
    in the patch's sandbox started beside the agent's (steps.running_agent): nothing the agent
    does while it runs changes what it makes. Raises GitError."""
    repo, base_objects, repo_stat = _checked(repo, base_sha, base_objects)
    git = Git(run, env, time.monotonic() + timeout_secs, timeout_secs)
    base = PatchBase(tempfile.TemporaryDirectory(prefix=".agent-patch-", dir=repo.parent), repo, base_sha, base_objects)
    try:
        scratch = base.scratch
        for folder in (scratch, base.home, base.empty, base.git_dir, base.git_dir / "info"):  # info: one exec fewer
            folder.mkdir(exist_ok=True)
            _chown_like(folder, repo_stat)  # git may run as the sandbox uid, which owns the repository
        rules, listed = scratch / "rules", scratch / "rules.list"
        git.script(
            _PATCH_BASE_SCRIPT,
            [
                str(base.git_dir),
                str(base_objects),
                base_sha,
                str(base.index),
                str(repo),
                _ATTRIBUTES_RESET,
                str(rules),
                str(listed),
                str(scratch),
            ],
            stages=_PATCH_STAGES,
            cwd=repo,
            extra_env=base.env(),
        )
        ignore_rules, attributes = _base_rules(rules, _read_nofollow(listed))
        write_file_nofollow(scratch, "git/info/attributes", f"{_ATTRIBUTES_RESET}\n{attributes}".encode(_FS, _ESC))
        write_file_nofollow(scratch, "base.gitignore", ignore_rules.encode(_FS, _ESC))
    except BaseException:
        base.remove()
        raise
    return base


def _checked(repo: Path, base_sha: str, base_objects: Path) -> tuple[Path, Path, os.stat_result]:
    if not _HEX_RE.match(base_sha):
        raise GitError(f"agent patch: base commit {base_sha!r} is not a sha")
    repo = Path(repo).absolute()
    base_objects = Path(base_objects).absolute()
    repo_stat, objects_stat = _lstat(repo), _lstat(base_objects)
    if repo_stat is None or not stat.S_ISDIR(repo_stat.st_mode) or "\n" in str(repo):
        raise GitError(f"agent patch: {repo} is missing or is not a folder")
    if objects_stat is None or not stat.S_ISDIR(objects_stat.st_mode) or "\n" in str(base_objects):
        raise GitError(f"agent patch: the base's objects {base_objects} are missing")
    return repo, base_objects, repo_stat


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
    base: PatchBase | None = None,
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

    ``base``: ``read_base``'s, made ahead for the same repository, commit and objects (else it is
    made here); removed here in any case.
    """
    try:
        repo, base_objects, _ = _checked(repo, base_sha, base_objects)
        pathspec = ["."] + [f":(exclude,literal,top){_clean_relpath(p)}" for p in exclude]
        deadline = time.monotonic() + timeout_secs
        if base is not None and not base.made_for(repo, base_sha, base_objects):
            base.remove()
            base = None
        if base is None:
            base = read_base(
                run, repo=repo, base_sha=base_sha, base_objects=base_objects, env=env, timeout_secs=timeout_secs
            )
        git = Git(run, env, deadline, timeout_secs)
        scratch, no_home = base.scratch, base.env()
        args = [str(base.git_dir), str(repo), str(base.index), str(scratch), base_sha, *pathspec]
        result = git.script(_PATCH_LIST_SCRIPT, args, stages=_PATCH_STAGES, cwd=repo, extra_env=no_home)
        if result.exit_code == _PATCH_NEEDS_LISTING or _needs_listing(scratch):
            _list_new_files(git, repo, scratch, base.git_dir, base.empty, no_home)
            git.script(_PATCH_SCRIPT, args, stages=_PATCH_STAGES, cwd=repo, extra_env=no_home)
        out = scratch / "agent.patch"
        fd = os.open(out, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as patch_file:
            size = os.fstat(fd).st_size
            if max_bytes is not None and size > max_bytes:
                raise GitError(f"agent patch is {size} bytes, over the limit of {max_bytes} bytes")
            return as_text(patch_file.read())  # a NUL past git's 8000-byte look is diffed as text
    finally:
        if base is not None:
            base.remove()


# What makes the list script's diff wrong: a new file's path with a trailing slash (a folder holding a
# repository), a `.git` component in any case, or a `.gitmodules` (git refuses a link of that name).
_NEEDS_LISTING_RE = re.compile(rb"/$|(^|/)[.]git(/|$)|(^|/)[.]gitmodules$", re.IGNORECASE)


def _needs_listing(scratch: Path) -> bool:
    """Whether the agent made a repository inside the work tree (the gitlinks of the index differ
    from the base's, or a new path names one) or picked a name git refuses: then repo_patch lists
    the new files itself."""
    base, now = (_gitlink_entries(_read_nofollow(scratch / name)) for name in ("stage.base", "stage.now"))
    if base != now:
        return True  # a gitlink added, removed or moved to another commit
    return any(_NEEDS_LISTING_RE.search(path) for path in _read_nofollow(scratch / "others").split(b"\0") if path)


def _list_new_files(git: Git, repo: Path, scratch: Path, git_dir: Path, empty: Path, env: dict) -> None:
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


def _gitlink_entries(stage: bytes) -> list[bytes]:
    """The gitlinks' entries (mode, commit, stage and path) in ``ls-files -z --stage`` output."""
    return [entry for entry in stage.split(b"\0") if entry.startswith(b"160000 ")]


def _gitlinks(stage: bytes) -> set[bytes]:
    """The paths of the gitlinks in ``ls-files -z --stage`` output."""
    return {entry.partition(b"\t")[2] for entry in _gitlink_entries(stage)}


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


def _clean_relpath(path: str) -> str:
    cleaned = path.strip("/")
    while cleaned.startswith("./"):
        cleaned = cleaned[2:]
    parts = cleaned.split("/")
    if not cleaned or os.path.isabs(path) or ".." in parts or has_control(cleaned):
        raise GitError(f"agent patch: excluded path {path!r} is not a relative path inside the repository")
    return cleaned


def _chown_like(path: Path, owner: os.stat_result) -> None:
    """Give ``path`` to ``owner``'s uid when we are root and it is another uid."""
    if os.geteuid() == 0 and owner.st_uid != 0:
        os.chown(path, owner.st_uid, owner.st_gid)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except OSError:
        return None
