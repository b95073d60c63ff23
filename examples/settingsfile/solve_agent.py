"""A solving agent: the file's values go over the defaults, not under them."""

import argparse
import pathlib

import settingsfile  # installed by `pip install -e .` in the evaluation's venv

parser = argparse.ArgumentParser()
parser.add_argument("--instruction", required=True)
args = parser.parse_args()
print("issue:", args.instruction.splitlines()[0])
print("package:", settingsfile.__file__)

source = pathlib.Path("settingsfile/__init__.py")
text = source.read_text()
text = text.replace(
    "    from_file = tomli.loads(text)\n"
    "    settings = dict(from_file)\n"
    "    settings.update(DEFAULTS if defaults is None else defaults)\n",
    "    settings = dict(DEFAULTS if defaults is None else defaults)\n    settings.update(tomli.loads(text))\n",
)
source.write_text(text)
