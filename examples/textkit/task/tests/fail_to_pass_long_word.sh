#!/bin/bash
# The issue's second case; fails before the fix.
python3 -m unittest -v tests.test_wrap_issue.WrapIssueTest.test_long_word_is_split
