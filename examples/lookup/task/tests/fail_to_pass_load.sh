#!/bin/bash
set -e
# {{static:words}} is the read-only word list: /static/data/words.txt under the sandbox.
python3 -c 'from lookup import load; words = load("{{static:words}}"); assert words == ["alpha", "beta", "gamma", "delta"], words; print("load ok")'
