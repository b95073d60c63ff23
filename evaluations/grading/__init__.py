"""Grading (SPEC §17 "Graders" and "Rewards", §19, §22): one ``Grader`` per grader name, one interface.

A grader says what runs after the agent and how its result is read into test results, an output
block and a reward; then how the evaluation ends. The pipeline's ``running_tests`` step picks one
(``registry.for_task``), hands it the tests' sandbox (``base.Sandbox``, made of its Context by
pipeline/grading_sandbox.py), stores the grade's rows (``lifecycle.store_test_results``), and
``run._verdict`` asks the same grader how the evaluation ends.

- base.py: ``Grade``, ``Verdict``, ``Sandbox`` (what a grader is given), ``Grader`` (the interface).
- registry.py: the grader of a task, by its name.
- exit_code.py, reward_file.py, pytest_grader.py, terminal_bench.py, swebench.py: the graders, one a
  module; scripts.py runs a workspace task's test scripts one by one (exit_code, pytest, reward_file).
- parsers/: what the graders read, as pure functions of text: pytest's short test summary, SWE-bench's
  log parsers and its ids matched as SWE-bench matches them.
- tbparsers.py: which grader a Terminal-Bench task's ``parser_name`` stands for (read with the task).

Layering (tests/test_layout.py): nothing here imports the pipeline; ``parsers/`` imports nothing of
the tree but itself. This package's ``__init__`` imports nothing, so the task readers may import
``parsers/`` and ``tbparsers`` before Django's apps are loaded.
"""
