#!/bin/bash
# The existing tests (pytest from the install step, tomli from `pip install -e .`).
pytest -q -p no:cacheprovider tests/test_load.py
