"""A solving agent: the file's values go over the defaults, not under them."""

import argparse
import pathlib
import subprocess

parser = argparse.ArgumentParser()
parser.add_argument("--instruction", required=True)
args = parser.parse_args()
print("issue:", args.instruction.splitlines()[0])
# The agent's own interpreter is the executor's, not the task venv's: the venv's programs are
# commands on PATH (`python3` here), which see what `pip install -e .` installed.
where = subprocess.run(
    ["python3", "-c", "import settingsfile; print(settingsfile.__file__)"], capture_output=True, text=True
)
print("package:", where.stdout.strip())

source = pathlib.Path("settingsfile/__init__.py")
text = source.read_text()
text = text.replace(
    "    from_file = tomli.loads(text)\n"
    "    settings = dict(from_file)\n"
    "    settings.update(DEFAULTS if defaults is None else defaults)\n",
    "    settings = dict(DEFAULTS if defaults is None else defaults)\n    settings.update(tomli.loads(text))\n",
)
source.write_text(text)
