"""SWE-bench's grading (SPEC §19), written here after SWE-bench's harness (``swebench/harness/
log_parsers/python.py``, ``grading.py``, ``test_spec/python.py``): its package is not imported at
run time (it imports docker and modal and pins the dataset tooling).

- parsers.py: the log parsers, one per repository (``REPO_PARSERS``), by name (``PARSERS``).
- grading.py: the parsed region of the log, ids matched as SWE-bench matches them, the verdict.
- tests.py: the ``running_tests`` step of a task graded ``swebench``.
"""
