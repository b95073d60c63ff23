"""A non-solving agent: looks around and changes nothing."""

import os
import sys

print("cwd:", os.getcwd(), "args:", sys.argv[1:2])
