"""A solving agent: rewrites textkit/wrap.py so lines fill exactly and long words are split."""

import argparse
import pathlib

parser = argparse.ArgumentParser()
parser.add_argument("--instruction", required=True)
args = parser.parse_args()
print("issue:", args.instruction.splitlines()[0])

FIXED = '''def wrap(text: str, width: int) -> list[str]:
    """Split text into lines of at most `width` characters, breaking between words.

    A word longer than `width` is split across lines.
    """
    if width < 1:
        raise ValueError("width must be at least 1")
    lines: list[str] = []
    current = ""
    for word in text.split():
        while len(word) > width:
            if current:
                lines.append(current)
                current = ""
            lines.append(word[:width])
            word = word[width:]
        if not word:
            continue
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines
'''
pathlib.Path("textkit/wrap.py").write_text(FIXED)
print("rewrote textkit/wrap.py")
