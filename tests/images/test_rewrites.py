"""IMAGE_REWRITES (SPEC §22): read and refused at start, matched as references, applied by the one
pull every image goes through (a task's image, a Dockerfile's FROM), with a real registry."""

from __future__ import annotations

import pytest

from evaluations.images.errors import ImageUnavailable
from evaluations.images.pull import pull
from evaluations.images.reference import rewrite
from executor_project.config import ConfigError
from executor_project.settings_loader import load
from tests.helpers.images import image_config, layer, member, push_image

GHOST = "registry.invalid/nowhere/ghost:1.0"  # a host no resolver knows: only a rewrite reaches it


def test_rewrites_are_read_in_order():
    config = load({"IMAGE_REWRITES": " python:3.12=127.0.0.1:5000/py:3.12 , ghcr.io/a/b:1=localhost/c:2,"})
    assert config.image_rewrites == (("python:3.12", "127.0.0.1:5000/py:3.12"), ("ghcr.io/a/b:1", "localhost/c:2"))
    assert load({}).image_rewrites == ()


@pytest.mark.parametrize(
    "value, message",
    [
        ("python:3.12", "IMAGE_REWRITES: entry 1 must be ref=ref (two image references), got 'python:3.12'"),
        ("a=b,=c", "IMAGE_REWRITES: entry 2 must be ref=ref (two image references), got '=c'"),
        ("a=b=c", "IMAGE_REWRITES: entry 1 must be ref=ref (two image references), got 'a=b=c'"),
        ("Python:3=b", "IMAGE_REWRITES: entry 1: The image reference 'Python:3' must be lower case in its "
                       "repository name."),
        ("a=b:", "IMAGE_REWRITES: entry 1: The image reference 'b:' has an invalid tag '' (1 to 128 of "
                 "A-Z a-z 0-9 _ . -, not first . or -)."),
        ("python:3.12=x:1,docker.io/library/python:3.12=y:1",
         "IMAGE_REWRITES: entry 2: 'docker.io/library/python:3.12' is 'python:3.12' again (one rewrite each)"),
    ],
)  # fmt: skip
def test_a_malformed_entry_stops_start_up_naming_it(value, message):
    with pytest.raises(ConfigError) as info:
        load({"IMAGE_REWRITES": value})
    assert str(info.value) == message


def test_both_sides_are_read_as_references_and_the_match_is_exact():
    rules = (("docker.io/library/python:3.12", "127.0.0.1:5000/py:3.12"), ("busybox", "LOCALHOST:5000/bb:1"))
    hit = rewrite("python:3.12", rules)
    assert (str(hit.ref), hit.rewritten_from) == ("127.0.0.1:5000/py:3.12", "python:3.12")
    assert str(rewrite("index.docker.io/python:3.12", rules).ref) == "127.0.0.1:5000/py:3.12"
    assert str(rewrite("busybox:latest", rules).ref) == "LOCALHOST:5000/bb:1"  # no tag is :latest
    for other in ("python:3.13", "python", "ghcr.io/library/python:3.12", f"python:3.12@sha256:{'a' * 64}"):
        missed = rewrite(other, rules)
        assert missed.rewritten_from is None and str(missed.ref) != "127.0.0.1:5000/py:3.12", other
    once = rewrite("a:1", (("a:1", "b:1"), ("b:1", "c:1")))  # applied once, never chained
    assert str(once.ref) == "docker.io/library/b:1"


@pytest.mark.slow
def test_a_pull_of_a_reference_nowhere_takes_the_rewritten_one(registry, store):
    pushed = push_image(registry, "rewrites/target:v1", layers=[layer(member("marker", b"rewritten\n"))])
    lines: list[str] = []
    without = image_config(registry)
    config = image_config(registry, IMAGE_REWRITES=f"{GHOST}={pushed.ref},python:3.12={pushed.ref}")
    result = pull(GHOST, store=store, config=config, progress=lines.append)
    assert (result.record.digest, result.ref, result.rewritten_from) == (pushed.digest, pushed.ref, GHOST)
    assert lines[0] == f"image {GHOST} rewritten to {pushed.ref} (IMAGE_REWRITES)"
    assert (store.layer_tree(pushed.diff_ids[0]) / "marker").read_bytes() == b"rewritten\n"
    hub = pull("docker.io/library/python:3.12", store=store, config=config)  # the store's answer now
    assert (hub.cached, hub.record.digest, hub.rewritten_from) == (True, pushed.digest, "docker.io/library/python:3.12")
    plain = pull(pushed.ref, store=store, config=config)
    assert plain.rewritten_from is None and plain.ref == pushed.ref
    with pytest.raises(ImageUnavailable, match="registry.invalid"):  # without the setting, nowhere to be found
        pull(GHOST, store=store, config=without)
