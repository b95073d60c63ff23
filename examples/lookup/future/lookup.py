"""Look words up in a word list: one word a line; blank lines and # comments are not words."""


def load(path):
    with open(path, encoding="utf-8") as handle:
        return [line.strip() for line in handle if line.strip() and not line.lstrip().startswith("#")]


def contains(path, word):
    return word in load(path)
