#!/bin/bash
set -e
python3 -c 'from lookup import contains; assert contains("{{static:words}}", "beta"); print("contains ok")'
