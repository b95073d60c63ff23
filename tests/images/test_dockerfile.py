"""Reading a Dockerfile as Docker reads it: stages, forms, flags and variable substitution."""

from __future__ import annotations

import pytest

from evaluations.images import dockerfile as df
from evaluations.images.errors import ImageError

RUN = df.Instruction(3, "ENV", "")


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("$A", "one"),
        ("${A}x", "onex"),
        ("pre-$A-post", "pre-one-post"),
        ("$UNSET", ""),
        ("${UNSET:-fallback}", "fallback"),
        ("${EMPTY:-fallback}", "fallback"),
        ("${EMPTY-fallback}", ""),
        ("${UNSET-fallback}", "fallback"),
        ("${A:+alt}", "alt"),
        ("${EMPTY:+alt}", ""),
        ("${EMPTY+alt}", "alt"),
        ("${UNSET:-${A}}", "one"),
        ("'$A'", "$A"),
        ('"$A two"', "one two"),
        ("\\$A", "$A"),
        ('"a \\" quote"', 'a " quote'),
        ("cost: $", "cost: $"),
        ("$1", "$1"),
    ],
)
def test_substitution_as_docker(word, expected):
    assert df.expand(word, {"A": "one", "EMPTY": ""}, RUN) == expected


def test_a_required_variable_and_a_bad_form_are_errors_with_the_line():
    with pytest.raises(ImageError, match=r"^Dockerfile line 3 \(ENV\): NEED: set it\.$"):
        df.expand("${NEED:?set it}", {}, RUN)
    with pytest.raises(ImageError, match=r"unsupported substitution \$\{A/\.\.\.\}"):
        df.expand("${A/x/y}", {"A": "x"}, RUN)


def test_stages_names_flags_and_forms():
    text = """\
# syntax=docker/dockerfile:1
ARG VERSION=12
FROM debian:${VERSION} AS Base
RUN apt-get update && \\
    apt-get install -y hello
FROM base
COPY --from=base --chown=1:2 a b /dst/
CMD ["hello", "-g", "hi"]
ENV OLD the whole value
"""
    parsed = df.parse(text)
    assert [i.keyword for i in parsed.global_args] == ["ARG"]
    assert [len(stage.instructions) for stage in parsed.stages] == [1, 3]
    assert df.stage_name(parsed.stages[0]) == "base" and parsed.stage_index("BASE".lower(), 2) == 0
    run = parsed.stages[0].instructions[0]
    assert run.line == 4 and run.value == "apt-get update &&     apt-get install -y hello"
    copy, cmd, env = parsed.stages[1].instructions
    assert df.split_flags(copy) == ({"from": "base", "chown": "1:2"}, ["a", "b", "/dst/"])
    assert df.command(cmd, cmd.value, ["/bin/sh", "-c"]) == ["hello", "-g", "hi"]
    assert df.command(run, run.value, ["/bin/sh", "-c"])[:2] == ["/bin/sh", "-c"]
    assert df.key_values(env, {}) == [("OLD", "the whole value")]


@pytest.mark.parametrize(
    ("text", "sentence"),
    [
        ("FROM a\nCOPY --bogus=1 a b\n", "Dockerfile line 2 (COPY): the flag --bogus is not supported."),
        ("FROM a\nCOPY --from a b\n", "Dockerfile line 2 (COPY): the flag --from needs a value (--from=VALUE)."),
        ("FROM a AS x\nFROM b AS X\n", "Dockerfile line 2 (FROM): the stage name 'x' is used twice."),
        ("FROM a\nLABEL novalue\n", "Dockerfile line 2 (LABEL): expected KEY=VALUE pairs, got 'novalue'."),
        ("FROM a\nWORKDIR\n", "Dockerfile line 2 (WORKDIR): WORKDIR needs at least one argument."),
        ("FROM a\nCOPY 'a b\n", "Dockerfile line 2 (COPY): a ' quote is not closed."),
    ],
)
def test_syntax_errors_name_the_line_and_the_instruction(text, sentence):
    with pytest.raises(ImageError) as caught:
        parsed = df.parse(text)
        for stage in parsed.stages:
            for instruction in stage.instructions:
                if instruction.keyword in df.FLAGS:
                    df.split_flags(instruction)
                elif instruction.keyword == "LABEL":
                    df.key_values(instruction, {})
    assert str(caught.value) == sentence
