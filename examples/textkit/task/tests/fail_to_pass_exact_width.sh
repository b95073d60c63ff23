#!/bin/bash
# The issue's first case; fails before the fix.
python3 -m unittest -v tests.test_wrap_issue.WrapIssueTest.test_exact_width
