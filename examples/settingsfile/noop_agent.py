"""A non-solving agent: runs the existing tests with the venv's pytest, changes nothing."""

import subprocess

subprocess.run(["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], check=False)
