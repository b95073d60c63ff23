"""The suite's Debian tree as a registry image (the ``base_image`` fixture other tests build on)."""

import pytest

from evaluations.images.pull import pull

pytestmark = pytest.mark.slow


def test_the_base_image_pulls_into_a_usable_tree(base_image, base_config, store):
    registry, ref, digest = base_image
    lines = []
    result = pull(ref, store=store, config=base_config, progress=lines.append)
    assert result.record.digest == digest and ref == f"{registry.host}/base/debian:bookworm"
    assert len(lines) == 1 and lines[0].endswith("MB pulled")
    tree = store.layer_tree(result.record.layers[0])
    assert "bookworm" in (tree / "etc/os-release").read_text()
    assert (tree / "usr/bin/python3").exists() and (tree / "usr/bin/tree").exists()
    assert (tree / "bin").is_symlink()  # merged /usr: links kept as links
    assert store.layer_meta(result.record.layers[0])["files"] > 1000
    assert result.record.config["Cmd"] == ["bash"]
