"""What the graders read, as pure functions of text (SPEC §17, §19, §22); nothing of the tree imported.

- pytest_summary.py: pytest's ``-rA`` short test summary, as the ``pytest`` grader reads it and as
  Terminal-Bench's parser reads it.
- swebench_logs.py: SWE-bench's log parsers, one per repository.
- swebench_ids.py: the wrapper's log region, each id matched as SWE-bench matches it, the verdict.
"""
