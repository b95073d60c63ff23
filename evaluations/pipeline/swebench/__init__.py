"""workspace.yaml's ``swebench:`` mapping (spec.py, SPEC §19). SWE-bench's grading, written after
SWE-bench's harness (its log parsers, ids matched as it matches them, the verdict), is
evaluations/grading/: parsers/swebench_logs.py, parsers/swebench_ids.py and the grader, swebench.py.
"""
