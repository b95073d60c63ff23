"""The guarded readers every task format shares (SPEC §4, §17): files, YAML, values, and the caps.

YAML (``workspace.yaml``, ``task.yaml``, ``docker-compose.yaml``) is parsed
with PyYAML's safe loader (``load_yaml``), after three guards:

1. the file is at most ``MAX_YAML_BYTES``;
2. every tag is a plain YAML one (``!!python/...`` is named and refused,
   not just failed on by the constructor);
3. the document, with every alias expanded, has at most ``MAX_YAML_NODES``
   nodes, so a "billion laughs" alias bomb (or a merge-key one) is refused
   before anything walks it; a recursive alias is refused too.

Files are read with their size checked from the inode first (``read_bytes``): nothing over a cap
reaches memory. A link or anything but a plain file or folder is refused, named.
"""

from __future__ import annotations

import datetime
import errno
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import yaml

from evaluations.environments import BadEnvironment, check_name
from evaluations.images import inroot, reference
from evaluations.images.errors import ImageError
from evaluations.tasks.spec import ImageEnvironment, SupportFile, TaskError

MAX_YAML_BYTES = 1024 * 1024


MAX_YAML_NODES = 100_000


# prompt.md is the agent's --instruction argument: Linux refuses one argv string over 128 KiB
# (MAX_ARG_STRLEN), so that file is held to this whatever MAX_PROMPT_BYTES says.
MAX_INSTRUCTION_BYTES = 128 * 1024 - 1


ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


CONTROL_CHARS = re.compile(r"[\x00-\x20\x7f]")


_YAML_TAG = "tag:yaml.org,2002:"


_PLAIN_TAGS = {
    _YAML_TAG + t for t in ("str", "int", "float", "bool", "null", "seq", "map", "timestamp", "binary", "merge")
}


@dataclass(frozen=True)
class TaskLimits:
    """What the operator lets a task folder hold, handed to every format's ``load``: each cap is
    checked before the text it bounds is read (a file's size from its inode, tests as they are
    counted). ``allow_file_urls``: a ``file://`` repository is accepted (tests and local runs)."""

    max_prompt_bytes: int
    max_tests: int
    allow_file_urls: bool


def load_yaml_mapping(path: Path, shown: str) -> tuple[dict, yaml.MappingNode]:
    """The YAML file ``shown`` (required) as a mapping, and its node, after the three guards."""
    data, node = load_yaml(path, shown)
    if node is None:
        raise TaskError(f"{shown} is empty; it must be a mapping of keys to values")
    if not isinstance(data, dict):
        raise TaskError(f"{shown} must be a mapping of keys to values, not {type_name(data)}")
    return data, node


def load_yaml(path: Path, shown: str) -> tuple[object, yaml.Node | None]:
    """The YAML file ``shown`` (required), and its node (None: the file holds no document), after
    the three guards."""
    raw = read_bytes(path, shown, required=True, cap=Cap(MAX_YAML_BYTES))
    loader = None
    try:
        loader = yaml.SafeLoader(raw)  # checks the encoding already
        node = loader.get_single_node()
        if node is None:
            return None, None
        _check_nodes(node, shown)
        data = loader.construct_document(node)
    except yaml.reader.ReaderError:
        raise TaskError(f"{shown} is not valid UTF-8 text") from None
    except yaml.MarkedYAMLError as exc:
        where = f"line {exc.problem_mark.line + 1}: " if exc.problem_mark else ""
        raise TaskError(f"{shown} is not valid YAML ({where}{exc.problem})") from None
    except yaml.YAMLError as exc:
        raise TaskError(f"{shown} is not valid YAML ({' '.join(str(exc).split())})") from None
    except RecursionError:
        raise TaskError(f"{shown} is nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, node


def _check_nodes(root: yaml.Node, shown: str) -> None:
    """Refuse non-plain tags, recursive aliases and too big an expanded document.

    Aliases make the node graph a DAG (or a cycle); the expanded size is
    computed once per distinct node (memoised), so the check itself is
    linear in the file, whatever the bomb would expand to.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            total = 1 + sum(sizes[id(child)] for child in _children(node))
            sizes[key] = min(total, MAX_YAML_NODES + 1)
            open_nodes.discard(key)
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise TaskError(f"{shown} has a recursive alias (line {node.start_mark.line + 1})")
        if node.tag not in _PLAIN_TAGS:
            tag = node.tag.replace(_YAML_TAG, "!!")
            raise TaskError(
                f"{shown} uses the YAML tag {tag} (line {node.start_mark.line + 1}); only plain values are allowed"
            )
        open_nodes.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_nodes:
                raise TaskError(f"{shown} has a recursive alias (line {child.start_mark.line + 1})")
            if id(child) not in sizes:
                stack.append((child, False))
    if sizes[id(root)] > MAX_YAML_NODES:
        raise TaskError(f"{shown} expands to more than {MAX_YAML_NODES} values (alias bomb?)")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


MAX_IMAGE_REF_CHARS = 512  # Docker's own limit on a reference is 255 per name; a digest adds 72


def image_environment(image: object, key: str, where: str) -> ImageEnvironment:
    """``ImageEnvironment(image=...)`` for a reference of the right form; ``key`` names the key,
    ``where`` prefixes the reference parser's own sentence (which names the reference)."""
    if not isinstance(image, str) or not image.strip():
        raise TaskError(f"{key} must be an image reference such as python:3.12-slim")
    if len(image) > MAX_IMAGE_REF_CHARS or CONTROL_CHARS.search(image) or any(c.isspace() for c in image):
        raise TaskError(f"{key} {image[:80]!r} is not an image reference")
    try:
        reference.parse(image)  # its form; the registry it names is IMAGE_DEFAULT_REGISTRY's business
    except ImageError as exc:
        raise TaskError(f"{where}: {exc}") from None
    return ImageEnvironment(image=image)


def environment_choice(value: str, where: str) -> str | ImageEnvironment:
    """An operator's environment (LANGUAGE_ENVIRONMENTS): an image reference when it has a ``/``, ``:``
    or ``@`` (``golang:1.22``; environment names have none), else a name under ENVIRONMENTS_ROOT.
    TaskError (``where`` first) when it is neither."""
    if any(mark in value for mark in "/:@"):
        return image_environment(value, where, where)
    try:
        return check_name(value)
    except BadEnvironment as exc:
        raise TaskError(f"{where}: {exc} (nor is it an image reference such as golang:1.22)") from None


def inside_task(path: object, root: Path, where: str, *, want_dir: bool) -> str:
    """``path`` relative to the task root, normalised; it must name a file (or folder) inside it.

    ``where`` names the key that gave it ("workspace.yaml: 'environment': 'dockerfile'")."""
    if not isinstance(path, str) or not path:
        raise TaskError(f"{where} must be a path inside the task")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if path.startswith("/") or ".." in parts:
        raise TaskError(f"{where} {path!r} must be a relative path inside the task, without '..'")
    relative = "/".join(parts) or "."
    st = _stat_beneath(root, relative)
    if st is False:
        raise TaskError(f"{where} {path!r} leads outside the task (a symbolic link)")
    if want_dir and (st is None or not stat.S_ISDIR(st.st_mode)):
        raise TaskError(f"{where} {path!r} is not a folder of the task")
    if not want_dir and (st is None or not stat.S_ISREG(st.st_mode)):
        raise TaskError(f"{where} {path!r} is not a file of the task")
    return relative


def _stat_beneath(root: Path, relative: str) -> os.stat_result | None | bool:
    """What ``relative`` names below ``root``, resolved by the one resolver (images/inroot.py) with
    no way out: None when nothing is there, False when a link leads outside the task."""
    root_fd = inroot.open_root(root)
    try:
        fd = inroot.open_in(root_fd, relative, os.O_PATH, beneath=True)
    except OSError as exc:
        return False if exc.errno == errno.EXDEV else None
    finally:
        os.close(root_fd)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def value_node(mapping: yaml.Node | None, key: str) -> yaml.Node | None:
    """The node of ``key``'s value in a YAML mapping node, or None."""
    if isinstance(mapping, yaml.MappingNode):
        for key_node, node in mapping.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                return node
    return None


def raw_scalar(mapping: yaml.Node | None, key: str) -> str | None:
    """The text of ``key``'s scalar as written (``0123`` stays ``0123``, ``3.10`` stays ``3.10``)."""
    node = value_node(mapping, key)
    return node.value if isinstance(node, yaml.ScalarNode) else None


def type_name(value: object) -> str:
    if value is None:
        return "empty"
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


class Cap(NamedTuple):
    """The most bytes a file may hold, and the setting that says so (named in the refusal)."""

    limit: int
    setting: str = ""


def prompt_cap(max_prompt_bytes: int, *, instruction: bool) -> Cap:
    """MAX_PROMPT_BYTES; for the agent's instruction (prompt.md, instruction.md, task.yaml's
    ``instruction``) at most MAX_INSTRUCTION_BYTES too."""
    if instruction and max_prompt_bytes > MAX_INSTRUCTION_BYTES:
        why = f"the most an agent's --instruction argument holds; MAX_PROMPT_BYTES is {max_prompt_bytes}"
        return Cap(MAX_INSTRUCTION_BYTES, why)
    return Cap(max_prompt_bytes, "MAX_PROMPT_BYTES")


def regular_file(path: Path, shown: str, *, required: bool) -> os.stat_result | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if required:
            raise TaskError(f"task has no {shown} (required)") from None
        return None
    if not stat.S_ISREG(st.st_mode):
        raise TaskError(f"{shown} is not a regular file")
    return st


def read_bytes(path: Path, shown: str, *, required: bool, cap: Cap | None = None) -> bytes | None:
    """The file's bytes; over ``cap`` it is refused from its size, before a byte is read."""
    st = regular_file(path, shown, required=required)
    if st is None:
        return None
    if cap is not None and st.st_size > cap.limit:
        raise TaskError(f"{shown} is larger than {cap.limit} bytes" + (f" ({cap.setting})" if cap.setting else ""))
    with open(path, "rb") as f:
        return f.read()


def read_text(path: Path, shown: str, *, required: bool, lenient: bool = False, cap: Cap | None = None) -> str | None:
    raw = read_bytes(path, shown, required=required, cap=cap)
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8-sig", errors="replace" if lenient else "strict")
    except UnicodeDecodeError:
        raise TaskError(f"{shown} is not valid UTF-8 text") from None
    # A replaced byte is 3 (U+FFFD): what is stored is held to the cap too.
    if lenient and cap is not None and len(text.encode()) > cap.limit:
        raise TaskError(f"{shown} is larger than {cap.limit} bytes once its invalid UTF-8 is replaced ({cap.setting})")
    return text


def is_folder(path: Path, shown: str) -> bool:
    """False if nothing is there; True for a folder; anything else (a link too) is refused, named."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        raise TaskError(f"{shown} is not a folder")
    return True


def folder_files(folder: Path, shown: str) -> list[SupportFile]:
    """Every file under ``folder`` (shown as ``shown``), by path relative to it, sorted; a link or
    anything but a plain file or folder is refused, named."""
    files = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        here = Path(dirpath)
        for name in dirnames + filenames:
            st = os.lstat(here / name)
            rel = (here / name).relative_to(folder).as_posix()
            if stat.S_ISLNK(st.st_mode):
                raise TaskError(f"{shown}/{rel} is a symbolic link")
            if name in dirnames:
                continue
            if not stat.S_ISREG(st.st_mode):
                raise TaskError(f"{shown}/{rel} is not a regular file")
            data = (here / name).read_bytes()
            files.append(SupportFile(rel, data, 0o755 if st.st_mode & 0o111 else 0o644))
    files.sort(key=lambda f: f.relpath)
    return files


def is_number(value: object) -> bool:
    """An int or a float, not a bool (YAML's and TOML's numbers)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def jsonable(value: object) -> object:
    """TOML and YAML values as JSON holds them: dates as ISO text, non-finite floats as text."""
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
