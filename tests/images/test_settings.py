"""The image settings: defaults, and each bad value stopping start-up with one line naming it."""

import pytest

from executor_project.config import ConfigError, load


def test_defaults(tmp_path):
    config = load({"DATA_DIR": str(tmp_path)})
    assert config.image_default_registry == "docker.io"
    assert config.images_root == tmp_path / "images"
    assert config.images_max_bytes == 50 * 1024**3
    assert config.image_tag_ttl_secs == 3600
    assert config.build_timeout_secs == 1800
    assert config.build_network == "on"
    assert config.registry_mirrors == {}
    assert config.registry_auth_file is None


def test_mirrors_and_insecure_registries(tmp_path):
    auth = tmp_path / "auth.json"
    auth.write_text("{}")
    config = load(
        {
            "IMAGE_REGISTRY_MIRRORS": "docker.io=mirror.local:5000, docker.io=second.local,ghcr.io=m.local",
            "IMAGE_INSECURE_REGISTRIES": "mirror.local:5000",
            "REGISTRY_AUTH_FILE": str(auth),
            "IMAGES_DIR": str(tmp_path / "store"),
            "BUILD_NETWORK": "OFF",
        }
    )
    assert config.registry_mirrors == {"docker.io": ("mirror.local:5000", "second.local"), "ghcr.io": ("m.local",)}
    assert config.image_insecure_registries == ("mirror.local:5000",)
    assert config.images_root == tmp_path / "store"
    assert config.build_network == "off"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"IMAGE_REGISTRY_MIRRORS": "mirror.local"},
            "IMAGE_REGISTRY_MIRRORS: each entry is registry=mirror (host[:port] each), got 'mirror.local'",
        ),
        (
            {"IMAGE_REGISTRY_MIRRORS": "docker.io=https://m/"},
            "IMAGE_REGISTRY_MIRRORS: each entry is registry=mirror (host[:port] each), got 'docker.io=https://m/'",
        ),
        (
            {"IMAGE_INSECURE_REGISTRIES": "http://x"},
            "IMAGE_INSECURE_REGISTRIES: expected host[:port] entries, got 'http://x'",
        ),
        ({"IMAGE_DEFAULT_REGISTRY": "a b"}, "IMAGE_DEFAULT_REGISTRY: expected host[:port], got 'a b'"),
        ({"REGISTRY_AUTH_FILE": "/nonexistent/auth.json"}, "REGISTRY_AUTH_FILE: no such file /nonexistent/auth.json"),
        ({"IMAGES_MAX_BYTES": "-1"}, "IMAGES_MAX_BYTES: must be at least 0, got -1"),
        ({"IMAGE_TAG_TTL_SECS": "soon"}, "IMAGE_TAG_TTL_SECS: expected an integer, got 'soon'"),
        ({"BUILD_TIMEOUT_SECS": "0"}, "BUILD_TIMEOUT_SECS: must be at least 1, got 0"),
        ({"BUILD_NETWORK": "maybe"}, "BUILD_NETWORK: expected one of on, off, got 'maybe'"),
    ],
)
def test_each_bad_value_is_one_line_naming_it(env, message):
    with pytest.raises(ConfigError) as caught:
        load(env)
    assert str(caught.value) == message
