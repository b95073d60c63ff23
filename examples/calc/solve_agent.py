"""A solving agent: reads the instruction, fixes add() in calc.py."""

import argparse
import pathlib

parser = argparse.ArgumentParser()
parser.add_argument("--instruction", required=True)
args = parser.parse_args()
print("instruction:", args.instruction.splitlines()[0])
source = pathlib.Path("calc.py")
source.write_text(source.read_text().replace("def add(a, b):\n    return a - b", "def add(a, b):\n    return a + b"))
print("patched calc.py")
