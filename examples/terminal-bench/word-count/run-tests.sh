#!/bin/bash
# As Terminal-Bench runs it: from the working directory, the tests in $TEST_DIR, pytest's -rA summary
# is what the grader reads.
/opt/test-venv/bin/pytest "$TEST_DIR/test_outputs.py" -rA -p no:cacheprovider
