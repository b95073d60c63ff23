import settingsfile


def test_the_file_overrides_the_defaults():
    assert settingsfile.load("port = 9000\ndebug = true")["port"] == 9000


def test_the_file_overrides_given_defaults():
    assert settingsfile.load('host = "0.0.0.0"', {"host": "localhost"}) == {"host": "0.0.0.0"}
