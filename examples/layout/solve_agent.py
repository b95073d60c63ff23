"""A solving agent: runs the environment's `tree` and writes its listing to MANIFEST.txt."""

import argparse
import pathlib
import subprocess

parser = argparse.ArgumentParser()
parser.add_argument("--instruction", required=True)
args = parser.parse_args()
listing = subprocess.run(
    ["tree", "--noreport", "--charset=ascii", "-I", "__pycache__", "src"], capture_output=True, text=True, check=True
).stdout
pathlib.Path("MANIFEST.txt").write_text(listing)
print("MANIFEST.txt rewritten:", len(listing.splitlines()), "lines")
