"""The workspace cache end to end (SPEC §13): whole evaluations through the pipeline, without and
with bubblewrap, against real repositories served over HTTP."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from evaluations.cache.store import Store
from tests.helpers.archives import Exec
from tests.helpers.gitrepos import git
from tests.helpers.tasks import ADD_TEST, BUGGY, FIXED, SOLVER
from tests.pipeline.test_e2e import evaluate

pytestmark = pytest.mark.django_db(transaction=True)

if os.geteuid() != 0:
    pytest.skip("the workspace cache needs root (idmapped mounts)", allow_module_level=True)

# The install step leaves something in each of the three places a snapshot keeps, and says so in the log.
INSTALL_SH = """\
echo INSTALL-RAN-$RANDOM
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo 'FROM = "install"' > "$site/installed_mod.py"
echo from-install > "$HOME/install-note"
echo build-output > build.txt
"""
BASE = {"calc.py": BUGGY, "install.sh": INSTALL_SH, ".gitignore": "build.txt\n"}
INSTALL = ["bash install.sh"]
INSTALLED = Exec(
    "#!/bin/bash\nset -e\n"
    "python3 -c 'import installed_mod; assert installed_mod.FROM == \"install\"'\n"
    'test "$(cat "$HOME/install-note")" = from-install\n'
    'test "$(cat build.txt)" = build-output\n'
    "echo installed-ok\n"
)


def _tests(**more):
    return {"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_installed.sh": INSTALLED, **more}


def _store(config) -> Store:
    return Store(config.cache_root)


def _passed(evaluation) -> None:
    assert (evaluation.status, evaluation.error) == ("completed", ""), (
        evaluation.error + evaluation.test_output[-2000:] + evaluation.log[-3000:]
    )


def test_the_second_evaluation_of_a_task_starts_from_the_snapshot(tasks, e2e_config, sandbox):
    url = tasks.task(base_files=BASE, install=INSTALL, tests=_tests())
    first = evaluate(url, SOLVER, config=e2e_config, sandbox=sandbox)
    _passed(first)
    assert first.cache == "miss" and "INSTALL-RAN" in first.log
    second = evaluate(url, SOLVER, config=e2e_config, sandbox=sandbox)
    _passed(second)
    assert second.cache == "hit"
    assert "INSTALL-RAN" not in second.log  # neither cloned nor installed: the snapshot's state
    steps = [t.step for t in second.transitions.all()]
    assert steps == ["queued", "downloading_task", "cloning_repo", "installing_deps", "running_agent",
                     "running_tests", "cleanup", "done"]  # fmt: skip
    assert second.agent_patch == first.agent_patch  # the same diff, from the same base and install
    (entry,) = _store(e2e_config).all_entries()
    assert entry.hits()[0] == 1
    assert entry.meta["commit"] == tasks.last_shas[0]
