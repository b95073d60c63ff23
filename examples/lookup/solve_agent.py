"""A solving agent: reads the instruction and its copy of the word list, fixes load() in lookup.py."""

import argparse
import pathlib

parser = argparse.ArgumentParser()
parser.add_argument("--instruction", required=True)
args = parser.parse_args()
print("instruction:", args.instruction.splitlines()[0])
lines = pathlib.Path("data/words.txt").read_text().splitlines()
print("word list copy:", len(lines), "lines")
source = pathlib.Path("lookup.py")
source.write_text(
    source.read_text().replace(
        "[line.strip() for line in handle]",
        '[line.strip() for line in handle if line.strip() and not line.lstrip().startswith("#")]',
    )
)
print("patched lookup.py")
