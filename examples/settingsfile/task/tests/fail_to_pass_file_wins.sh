#!/bin/bash
# The issue: the file's values must override the defaults. Fails before the fix.
python -m pytest -q -p no:cacheprovider tests/test_file_wins.py
