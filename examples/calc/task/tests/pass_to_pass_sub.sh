#!/bin/bash
set -e
python3 -c 'from calc import sub; assert sub(5, 3) == 2; print("sub ok")'
