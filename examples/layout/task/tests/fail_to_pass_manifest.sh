#!/bin/bash
set -e
tree --noreport --charset=ascii -I __pycache__ src | diff -u MANIFEST.txt -
echo "manifest ok"
