from pathlib import Path

EXPECTED = ["the 5", "dog 3", "fox 3", "a 2", "and 1"]


def lines():
    return Path("/app/top5.txt").read_text().split("\n")


def test_file_exists():
    assert Path("/app/top5.txt").is_file()


def test_five_lines():
    assert [line for line in lines() if line] == EXPECTED


def test_input_untouched():
    assert Path("/app/input.txt").read_text().startswith("The quick brown fox")
