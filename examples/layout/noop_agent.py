"""A non-solving agent: looks around and changes nothing."""

import os

print("cwd:", os.getcwd())
