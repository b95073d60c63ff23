"""The agent's patch (``repo_patch``): its work tree against the base commit, with git it cannot steer.

The agent owns ``repo/.git``: its config could name a ``core.fsmonitor``
command, filter drivers that ``git add`` would run, ``diff.external``, ...
So the diff never uses that git dir: a private, empty one in a scratch
folder is used, with the repository's objects only as read-only alternates,
a throwaway index that starts at ``base_sha``, and the new blobs written to
the private object store. The agent's index, refs and objects are untouched.
Two ``sh`` scripts: one sandbox each instead of one per git command.

Nothing the agent writes decides what the patch shows (issue 23). git reads
rules from the work tree, from HOME and from the git dir; here:

- ignore rules come from the base commit's tree only. The first script
  writes out the base's ``.gitignore`` files; ``_base_rules`` turns them into
  one excludes file (each pattern anchored to its folder), and the new files
  are listed with ``ls-files --others --exclude-from`` that file alone, then
  added with ``--force``. A ``.gitignore`` the agent adds or edits hides
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

Every git command goes through the caller's ``CommandRunner`` and gitrepo.py's
shared layer (hardened git, one deadline, failures as ``GitError``).
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
from evaluations.safefs import write_file_nofollow

_HEX_RE = re.compile(r"^[0-9a-f]{4,64}$")

# The agent patch takes two scripts, both in the repository, with a private git dir, the agent's
# objects as read-only alternates and a throwaway index. The first ($1 private git dir, $2 the
# agent's objects, $3 base sha, $4 the index, $5 the work tree, $6 the attributes that switch
# every conversion off, $7 where the base's rule files go, $8 their list) reads the base tree and
# writes out the .gitignore and .gitattributes files it holds, as the base commit has them.
_PATCH_SETTINGS = (
    "core.bare=false",
    "core.filemode=true",
    "core.symlinks=true",
    "core.excludesFile=/dev/null",  # no excludes file but the base's rules (the default is in HOME)
    "core.attributesFile=/dev/null",
)
_PATCH_BASE_SCRIPT = f"""
{sh_git()} init --quiet --bare --template= -- "$1" || exit 10
printf '%s\\n' "$2" > "$1/objects/info/alternates" || exit 11
mkdir "$1/info" && printf '%s\\n' "$6" > "$1/info/attributes" || exit 11
export GIT_DIR="$1" GIT_WORK_TREE="$5" GIT_INDEX_FILE="$4" GIT_OPTIONAL_LOCKS=0
{sh_git(*_PATCH_SETTINGS)} read-tree "$3" || exit 12
{sh_git(*_PATCH_SETTINGS)} ls-files -z -- ':(top,glob)**/.gitignore' ':(top,glob)**/.gitattributes' > "$8" || exit 15
{sh_git(*_PATCH_SETTINGS)} checkout-index -z --stdin "--prefix=$7/" < "$8" || exit 16
"""
# The second ($1 private git dir, $2 base sha, $3 the patch file, $4 the work tree, $5 the index,
# $6 the base's ignore rules, $7 the list of new files, then the pathspec): tracked files as they
# are now, new files that the base's rules do not ignore (the work tree's .gitignore files are
# not read: --exclude-from alone), and the diff. $1/info/attributes holds the base's attributes.
_PATCH_SCRIPT = f"""
export GIT_DIR="$1" GIT_WORK_TREE="$4" GIT_INDEX_FILE="$5" GIT_OPTIONAL_LOCKS=0
base=$2 out=$3 ignored=$6 new=$7
shift 7
{sh_git(*_PATCH_SETTINGS)} add --update -- "$@" || exit 13
{sh_git(*_PATCH_SETTINGS)} ls-files -z --others "--exclude-from=$ignored" -- "$@" > "$new" || exit 15
if [ -s "$new" ]; then
  {sh_git(*_PATCH_SETTINGS)} --literal-pathspecs add --force "--pathspec-from-file=$new" --pathspec-file-nul || exit 13
fi
{sh_git(*_PATCH_SETTINGS)} diff --cached --binary --no-renames --no-ext-diff --no-textconv --no-color \\
    --src-prefix=a/ --dst-prefix=b/ "--output=$out" "$base" -- "$@" || exit 14
"""
_PATCH_STAGES = {
    10: "git init",
    11: "writing the private git dir's alternates and attributes",
    12: "git read-tree of the base commit",
    13: "git add of the working tree",
    14: "git diff",
    15: "git ls-files",
    16: "git checkout-index of the base's .gitignore and .gitattributes files",
}
# What changes how `git add` stores a file or how `git diff` shows it, unset for every path; only
# the base commit's .gitattributes (after this line, see _base_rules) set them again. The
# private git dir's info/attributes outranks every .gitattributes file in the work tree.
_ATTRIBUTES_RESET = "* !text !eol !crlf !filter !diff !ident !working-tree-encoding !binary"


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

    New files are included unless the base commit's ``.gitignore`` files
    ignore them (see the module notes), paths in ``exclude`` (relative to ``repo``, e.g. materialised static
    assets) are left out, and nothing of the agent's ``.git`` is run or
    changed. git gets ``env`` with HOME and ``XDG_CONFIG_HOME`` replaced by
    an empty folder of its own. A patch over ``max_bytes`` raises ``GitError``. Bytes that are
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
    git = Git(run, env, time.monotonic() + timeout_secs, timeout_secs)

    with tempfile.TemporaryDirectory(prefix=".agent-patch-", dir=repo.parent) as tmp:
        scratch = Path(tmp)
        home = scratch / "home"  # git's HOME: empty, nothing of the agent's (its own HOME is theirs)
        home.mkdir()
        for folder in (scratch, home):
            _chown_like(folder, git_dir_stat)  # git may run as the sandbox uid, which owns the repository
        git_dir, index, rules, listed = scratch / "git", scratch / "index", scratch / "rules", scratch / "rules.list"
        git.script(
            _PATCH_BASE_SCRIPT,
            [str(git_dir), str(objects), base_sha, str(index), str(repo), _ATTRIBUTES_RESET, str(rules), str(listed)],
            stages=_PATCH_STAGES,
            cwd=repo,
            extra_env={"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")},
        )
        ignore_rules, attributes = _base_rules(rules, _read_nofollow(listed))
        write_file_nofollow(scratch, "git/info/attributes", f"{_ATTRIBUTES_RESET}\n{attributes}".encode(_FS, _ESC))
        write_file_nofollow(scratch, "base.gitignore", ignore_rules.encode(_FS, _ESC))
        out = scratch / "agent.patch"
        git.script(
            _PATCH_SCRIPT,
            [
                str(git_dir),
                base_sha,
                str(out),
                str(repo),
                str(index),
                str(scratch / "base.gitignore"),
                str(scratch / "new.list"),
                *pathspec,
            ],
            stages=_PATCH_STAGES,
            cwd=repo,
            extra_env={"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")},
        )
        fd = os.open(out, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as patch_file:
            size = os.fstat(fd).st_size
            if max_bytes is not None and size > max_bytes:
                raise GitError(f"agent patch is {size} bytes, over the limit of {max_bytes} bytes")
            return as_text(patch_file.read())  # a NUL past git's 8000-byte look is diffed as text


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
