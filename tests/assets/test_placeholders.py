"""{{static:NAME}}: one pass, exact names, unknown ones named."""

from __future__ import annotations

import pytest

from assets.placeholders import PlaceholderError, substitute

PATHS = {"corpus": "/static/data/corpus", "my-corpus": "/static/mine", "x": "/static/x"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cat {{static:corpus}}/words.txt", "cat /static/data/corpus/words.txt"),
        ("--data={{static:corpus}}suffix", "--data=/static/data/corpussuffix"),  # inside a longer word
        ("{{static:x}}:{{static:corpus}} {{static:x}}", "/static/x:/static/data/corpus /static/x"),  # several
        ("ls {{static:my-corpus}}", "ls /static/mine"),  # a name with '-'
        ("{{STATIC:x}} {{ static:x }} {static:x} {{static:x}", "{{STATIC:x}} {{ static:x }} {static:x} {{static:x}"),
        ("no placeholder here", "no placeholder here"),
        ("{{{static:x}}}", "{/static/x}"),
        ("", ""),
    ],
)
def test_substitution(text, expected):
    assert substitute(text, PATHS) == expected


def test_what_was_inserted_is_not_scanned_again():
    paths = {"a": "{{static:b}}", "b": "/static/b"}
    assert substitute("{{static:a}} {{static:b}}", paths) == "{{static:b}} /static/b"


def test_names_are_matched_exactly():
    with pytest.raises(PlaceholderError, match=r"^unknown static asset placeholder: Corpus$"):
        substitute("{{static:Corpus}}", PATHS)
    with pytest.raises(PlaceholderError, match=r"^unknown static asset placeholder: corp$"):
        substitute("{{static:corp}}", PATHS)
    with pytest.raises(PlaceholderError, match=r"^unknown static asset placeholder:  corpus$"):
        substitute("{{static: corpus}}", PATHS)


def test_the_first_unknown_name_is_reported():
    with pytest.raises(PlaceholderError, match=r"^unknown static asset placeholder: nope$"):
        substitute("{{static:x}} {{static:nope}} {{static:other}}", PATHS)


def test_an_empty_name_is_an_error():
    with pytest.raises(
        PlaceholderError, match=r"^unknown static asset placeholder: \{\{static:\}\} has an empty name$"
    ):
        substitute("cat {{static:}}", PATHS)


def test_no_assets_and_no_placeholders_is_fine():
    assert substitute("echo {{not:static}}", {}) == "echo {{not:static}}"
    with pytest.raises(PlaceholderError, match="unknown static asset placeholder: x"):
        substitute("{{static:x}}", {})
