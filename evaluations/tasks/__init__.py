"""Reading a task folder, in every format it may come in, into a ``TaskSpec`` (SPEC §4, §17, §19).

``registry.load_task`` is the one entry: it walks ``registry.FORMATS``, in this order, and the first
format whose ``detect`` answers yes reads the folder:

- ``harbor`` (harbor.py): ``task.toml``, ``instruction.md``, ``environment/``, ``tests/test.sh``,
  ``solution/``.
- ``terminal-bench`` (terminal_bench.py): Terminal-Bench 1.x's ``task.yaml``, ``Dockerfile`` or
  ``docker-compose.yaml``, ``run-tests.sh``, ``tests/``, ``solution.sh`` or ``solution.yaml``.
- ``workspace`` (workspace.py): our own ``workspace.yaml`` with ``prompt.md``, ``tests/*.sh`` and
  ``checks.txt``; SWE-Forge's rows are workspace.yaml folders with keys of their own (sweforge.py),
  and a task graded ``swebench`` holds its ``swebench:`` mapping there (swebench.py).

A folder no format detects is refused with one sentence naming every file looked for. The rest of
the package: spec.py (``TaskSpec`` and its parts, ``TaskError``), readers.py (the guarded readers
and the caps), compose.py (a docker-compose file's single service), language.py (the toolchain a
task's ``language`` asks for, chosen at ``downloading_task``).

What holds for every format:

1. The caps (MAX_PROMPT_BYTES, MAX_TESTS, the YAML guards) are checked before the text they bound
   is read: a file's size from its inode, tests as they are counted; nothing over a cap reaches
   memory. A link or anything but a plain file or folder is refused, named.
2. Every refusal is one ``TaskError`` sentence naming the file and the key at fault.
3. What a format asks of the run goes into ``TaskSpec.request`` as written; capping it by the
   operator's limits is the pipeline's job.
4. What is not understood is kept, not dropped: ``metadata`` is the file minus the keys read here
   (Harbor: ``task.toml`` in its own shape, so ``[metadata]`` sits under ``"metadata"`` and an
   unknown ``[agent] user`` under ``"agent"``; Terminal-Bench: ``task.yaml``'s other keys;
   SWE-Forge: its difficulty and install_config).
5. What would run differently here than where the task was written is refused, not approximated:
   a Windows task, GPUs or TPUs, several services, a step's own user, healthcheck or staged files
   (harbor_steps.py: multi-step tasks otherwise run), a verifier container of its own, a compose service's own entrypoint or user, environment values taken from the host
   (``${VAR}``).
6. Harbor tasks are graded by their reward file; ``[verifier] grader = "pytest"`` (written by
   ``manage.py import_tasks`` for a converted Terminal-Bench task, ignored by Harbor itself) keeps
   Terminal-Bench's grading. Terminal-Bench tasks are graded by ``pytest``.
7. Nothing here imports the pipeline (tests/test_layout.py): the importers, the settings and the
   local runner read tasks without it. This file imports nothing, so importing ``tasks.spec``
   never loads the formats.
"""
