#!/bin/bash
# An untouched module's tests: a fix must not break them.
python3 -m unittest -v tests.test_slug
