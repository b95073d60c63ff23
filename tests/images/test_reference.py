"""Image references parsed as Docker parses them; each malformed form refused with one sentence."""

import pytest

from evaluations.images.errors import ImageError
from evaluations.images.reference import Reference, parse

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("python:3.12-slim", Reference("docker.io", "library/python", "3.12-slim", None)),
        ("python", Reference("docker.io", "library/python", "latest", None)),
        ("someone/tool", Reference("docker.io", "someone/tool", "latest", None)),
        ("index.docker.io/ubuntu:22.04", Reference("docker.io", "library/ubuntu", "22.04", None)),
        ("ghcr.io/o/n:t", Reference("ghcr.io", "o/n", "t", None)),
        (f"host:5000/n@{DIGEST}", Reference("host:5000", "n", None, DIGEST)),
        (f"localhost/a/b:c@{DIGEST}", Reference("localhost", "a/b", "c", DIGEST)),
        ("localhost:5000/x", Reference("localhost:5000", "x", "latest", None)),
        ("Registry.Example.com/a_b/c__d/e-f.g", Reference("Registry.Example.com", "a_b/c__d/e-f.g", "latest", None)),
        ("[::1]:5000/img:v", Reference("[::1]:5000", "img", "v", None)),
    ],
)
def test_references_read_as_docker_reads_them(text, expected):
    assert parse(text) == expected


def test_the_canonical_form_and_the_default_registry():
    assert str(parse("python:3.12")) == "docker.io/library/python:3.12"
    assert str(parse(f"h:1/n@{DIGEST}")) == f"h:1/n@{DIGEST}"
    assert str(parse("a/b:c@" + DIGEST)) == f"docker.io/a/b:c@{DIGEST}"
    assert str(parse("tool", default_registry="mirror.local:5000")) == "mirror.local:5000/tool:latest"
    assert str(parse(str(parse("python")))) == "docker.io/library/python:latest"  # canonical is a fixed point


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "The image reference is empty."),
        (" python", "contains whitespace or control characters"),
        ("Python:3", "must be lower case in its repository name"),
        ("a//b", "has an invalid path component ''"),
        ("a/-b", "has an invalid path component '-b'"),
        ("a/b_", "has an invalid path component 'b_'"),
        ("python:", "has an invalid tag ''"),
        ("python:.x", "has an invalid tag '.x'"),
        ("python:" + "x" * 129, "has an invalid tag"),
        ("python@sha256:abc", "has a digest that is not sha256:<64 lower-case hex>"),
        ("python@md5:" + "a" * 32, "has a digest that is not sha256"),
        ("python@" + DIGEST.upper(), "has a digest that is not sha256"),
        (":tag", "has no repository name"),
        ("bad_host.com:x:y/n", "has an invalid"),
        ("host..com/n", "has an invalid registry host 'host..com'"),
        ("a/" + "b" * 300, "over 255 characters"),
    ],
)
def test_each_malformed_reference_is_one_sentence(text, message):
    with pytest.raises(ImageError) as caught:
        parse(text)
    assert message in str(caught.value)
    assert str(caught.value).endswith(".")
    assert caught.value.kind == "task_invalid"
