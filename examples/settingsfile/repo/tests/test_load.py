import pytest
import settingsfile
import tomli


def test_an_empty_file_gives_the_defaults():
    assert settingsfile.load("") == settingsfile.DEFAULTS


def test_keys_only_in_the_file_are_kept():
    assert settingsfile.load('name = "demo"')["name"] == "demo"


def test_a_bad_file_is_a_toml_error():
    with pytest.raises(tomli.TOMLDecodeError):
        settingsfile.load("port = ")
