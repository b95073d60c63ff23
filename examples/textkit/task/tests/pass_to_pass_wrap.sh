#!/bin/bash
# wrap's existing tests: passed before the fix, must still pass.
python3 -m unittest -v tests.test_wrap
