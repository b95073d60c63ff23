#!/bin/bash
set -e
PYTHONDONTWRITEBYTECODE=1 python3 -c 'import sys; sys.path.insert(0, "src"); from app.core import greet; assert greet("x") == "hello x"; print("import ok")'
