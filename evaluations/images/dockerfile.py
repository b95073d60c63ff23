"""A Dockerfile read as Docker reads it: stages, instructions, flags, JSON or shell forms, and
variable substitution (SPEC §16). Nothing here runs or touches a file; build.py does.

Why ``dockerfile-parse`` (the maintained PyPI package, pinned in requirements.txt): it splits a
Dockerfile into instructions as Docker does, with the line each starts on, comments and parser
directives (``# escape=``) and line continuations handled; it stays out of everything else. Its
own variable substitution is turned off (``env_replace=False``): Docker expands a different set
of variables for each instruction (global ``ARG``s only for ``FROM``; the stage's ``ENV`` and
``ARG``s elsewhere; nothing for ``RUN``, whose shell does it), which the builder knows and the
parser does not, so ``expand`` below does it at build time, instruction by instruction.

Every error is an ``ImageError`` (task_invalid) whose sentence starts with the Dockerfile's line
and instruction: ``Dockerfile line 7 (COPY): ...``.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field

from dockerfile_parse import DockerfileParser

from evaluations.images.errors import ImageError

# What Docker runs a shell-form RUN, CMD and ENTRYPOINT with until SHELL says otherwise.
DEFAULT_SHELL = ("/bin/sh", "-c")
# The PATH a command gets when its image sets none (Docker's default for Linux).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Run at build time; the rest only change the image's config.
BUILD_STEPS = frozenset({"RUN", "COPY", "ADD", "WORKDIR"})
CONFIG_STEPS = frozenset(
    {"ENV", "ARG", "USER", "SHELL", "LABEL", "CMD", "ENTRYPOINT", "EXPOSE", "VOLUME", "HEALTHCHECK",
     "STOPSIGNAL", "ONBUILD", "MAINTAINER"}
)  # fmt: skip
# The flags each instruction accepts (Docker's names); any other is an error, not ignored.
FLAGS = {
    "FROM": {"platform"},
    "RUN": set(),
    "COPY": {"from", "chown", "chmod"},
    "ADD": {"chown", "chmod"},
    "HEALTHCHECK": {"interval", "timeout", "start-period", "start-interval", "retries"},
}
# Instructions whose arguments Docker substitutes variables in (RUN's are left to its shell).
SUBSTITUTED = frozenset(
    {"FROM", "ADD", "COPY", "ENV", "EXPOSE", "LABEL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR", "ARG"}
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FLAG = re.compile(r"--([a-z][a-z-]*)(?:=(.*))?", re.S)


@dataclass(frozen=True)
class Instruction:
    line: int  # 1-based, where the instruction starts
    keyword: str  # upper case: RUN, COPY, ...
    value: str  # its arguments as written, continuation lines joined

    def error(self, sentence: str) -> ImageError:
        return ImageError(f"Dockerfile line {self.line} ({self.keyword}): {sentence}")


@dataclass
class Stage:
    index: int
    source: Instruction  # its FROM
    instructions: list[Instruction] = field(default_factory=list)


@dataclass
class Dockerfile:
    global_args: list[Instruction]  # the ARGs before the first FROM: the only variables FROM sees
    stages: list[Stage]

    def stage_index(self, name_or_index: str, before: int) -> int | None:
        """The stage ``--from`` or ``target`` names (its ``AS`` name or its number), among the first ``before``."""
        for stage in self.stages[:before]:
            if stage_name(stage) == name_or_index.lower():
                return stage.index
        if name_or_index.isdigit() and int(name_or_index) < before:
            return int(name_or_index)
        return None


def parse(text: str) -> Dockerfile:
    """The Dockerfile ``text`` as stages; ImageError naming the line for anything Docker refuses."""
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode()), env_replace=False)
    global_args: list[Instruction] = []
    stages: list[Stage] = []
    for item in parser.structure:
        keyword = item["instruction"].upper()
        if keyword == "COMMENT":
            continue
        instruction = Instruction(item["startline"] + 1, keyword, item["value"].strip())
        if keyword not in BUILD_STEPS | CONFIG_STEPS | {"FROM"}:
            raise instruction.error(f"{keyword} is not a Dockerfile instruction this builder supports.")
        if not instruction.value and keyword not in ("CMD", "ENTRYPOINT"):
            raise instruction.error(f"{keyword} needs at least one argument.")
        if keyword == "FROM":
            stages.append(Stage(len(stages), instruction))
        elif not stages:
            if keyword != "ARG":
                raise instruction.error("only ARG may come before the first FROM.")
            global_args.append(instruction)
        else:
            stages[-1].instructions.append(instruction)
    if not stages:
        raise ImageError("The Dockerfile has no FROM instruction.")
    names = set()
    for stage in stages:
        name = stage_name(stage)
        if name is not None:
            if name in names:
                raise stage.source.error(f"the stage name {name!r} is used twice.")
            names.add(name)
    return Dockerfile(global_args, stages)


def stage_name(stage: Stage) -> str | None:
    _, words = split_flags(stage.source)
    if len(words) == 3 and words[1].lower() == "as":
        return words[2].lower()
    return None


# -- forms --------------------------------------------------------------------------------------


def split_flags(instruction: Instruction) -> tuple[dict[str, str], list[str]]:
    """``--name=value`` flags in front of the arguments, and the remaining words (unexpanded)."""
    words = split_words(instruction.value, instruction)
    allowed = FLAGS.get(instruction.keyword, set())
    flags: dict[str, str] = {}
    while words and words[0].startswith("--"):
        match = _FLAG.fullmatch(words[0])
        if match is None or match.group(1) not in allowed:
            raise instruction.error(f"the flag {words[0].split('=')[0]} is not supported.")
        if match.group(2) is None:
            raise instruction.error(f"the flag --{match.group(1)} needs a value (--{match.group(1)}=VALUE).")
        flags[match.group(1)] = match.group(2)
        words.pop(0)
    return flags, words


def rest_after_flags(instruction: Instruction) -> tuple[dict[str, str], str]:
    """The flags, and the arguments after them as written (for shell forms, which keep their spacing)."""
    flags, _ = split_flags(instruction)
    text = instruction.value
    for _ in flags:
        text = text.split(None, 1)[1] if len(text.split(None, 1)) > 1 else ""
    return flags, text.strip()


def json_form(text: str) -> list[str] | None:
    """The exec (JSON) form ``["a", "b"]``, or None for the shell form (what Docker decides the same way)."""
    if not text.startswith("["):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return None
    return value


def command(instruction: Instruction, text: str, shell: list[str]) -> list[str]:
    """RUN, CMD, ENTRYPOINT: the argv of the exec form, else ``shell + [text]``."""
    exec_form = json_form(text)
    if exec_form is not None:
        return exec_form
    return [*shell, text]


def key_values(instruction: Instruction, env: dict[str, str]) -> list[tuple[str, str]]:
    """ENV and LABEL: ``k=v k2="v 2"`` pairs, or the old ``ENV key the whole value`` form; expanded."""
    text = instruction.value
    words = split_words(text, instruction)
    if words and "=" not in words[0]:
        if instruction.keyword != "ENV" or len(words) < 2:
            raise instruction.error(f"expected KEY=VALUE pairs, got {text!r}.")
        key, _, value = text.partition(" ") if " " in text else text.partition("\t")
        return [(key, expand(value.strip(), env, instruction))]
    pairs = []
    for word in words:
        key, equals, value = word.partition("=")
        if not equals or not key:
            raise instruction.error(f"expected KEY=VALUE, got {word!r}.")
        pairs.append((expand(key, env, instruction), expand(value, env, instruction)))
    return pairs


# -- words and substitution (Docker's shell lexer) ------------------------------------------------


def split_words(text: str, instruction: Instruction) -> list[str]:
    """Split on whitespace outside quotes, quotes and backslashes kept (``expand`` removes them)."""
    words: list[str] = []
    current: list[str] = []
    quote = ""
    index = 0
    in_word = False
    while index < len(text):
        char = text[index]
        if quote:
            current.append(char)
            if char == "\\" and quote == '"' and index + 1 < len(text):
                current.append(text[index + 1])
                index += 1
            elif char == quote:
                quote = ""
        elif char.isspace():
            if in_word:
                words.append("".join(current))
                current, in_word = [], False
        else:
            in_word = True
            current.append(char)
            if char in "'\"":
                quote = char
            elif char == "\\" and index + 1 < len(text):
                current.append(text[index + 1])
                index += 1
        index += 1
    if quote:
        raise instruction.error(f"a {quote} quote is not closed.")
    if in_word:
        words.append("".join(current))
    return words


def expand(word: str, env: dict[str, str], instruction: Instruction) -> str:
    """One word as Docker processes it: quotes removed, backslash escapes, and $VAR, ${VAR},
    ${VAR:-default}, ${VAR-default}, ${VAR:+alt}, ${VAR+alt}, ${VAR:?message}; single quotes
    keep ``$`` literal. An unset variable is empty."""
    return _Lexer(word, env, instruction).word()


class _Lexer:
    def __init__(self, text: str, env: dict[str, str], instruction: Instruction):
        self.text, self.env, self.instruction, self.at = text, env, instruction, 0

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def next(self) -> str:
        char = self.peek()
        self.at += 1
        return char

    def word(self, stop: str = "") -> str:
        out = []
        while self.at < len(self.text) and self.peek() not in stop:
            char = self.next()
            if char == "'":
                end = self.text.find("'", self.at)
                if end < 0:
                    raise self.instruction.error("a ' quote is not closed.")
                out.append(self.text[self.at : end])
                self.at = end + 1
            elif char == '"':
                out.append(self.double_quoted())
            elif char == "\\":
                out.append(self.next())
            elif char == "$":
                out.append(self.variable())
            else:
                out.append(char)
        return "".join(out)

    def double_quoted(self) -> str:
        out = []
        while True:
            char = self.next()
            if char == "":
                raise self.instruction.error('a " quote is not closed.')
            if char == '"':
                return "".join(out)
            if char == "\\" and self.peek() in ('"', "$", "\\"):
                out.append(self.next())
            elif char == "$":
                out.append(self.variable())
            else:
                out.append(char)

    def variable(self) -> str:
        if self.peek() == "{":
            self.next()
            return self.braced()
        match = _NAME.match(self.text, self.at)
        if match is None:
            return "$"  # a lone $ is itself
        self.at = match.end()
        return self.env.get(match.group(), "")

    def braced(self) -> str:
        match = _NAME.match(self.text, self.at)
        if match is None:
            raise self.instruction.error(f"bad substitution in {self.text!r}.")
        name = match.group()
        self.at = match.end()
        if self.peek() == "}":
            self.next()
            return self.env.get(name, "")
        colon = self.peek() == ":"
        if colon:
            self.next()
        operator = self.next()
        if operator not in ("-", "+", "?"):
            raise self.instruction.error(f"unsupported substitution ${{{name}{':' if colon else ''}{operator}...}}.")
        argument = self.word(stop="}")
        if self.next() != "}":
            raise self.instruction.error(f"a ${{ in {self.text!r} is not closed.")
        value = self.env.get(name)
        present = value is not None and (value != "" or not colon)
        if operator == "-":
            return value if present else argument
        if operator == "+":
            return argument if present else ""
        if not present:
            raise self.instruction.error(f"{name}: {argument or 'is not set'}.")
        return value
