"""Tags through whole evaluations (SPEC §19, §13): a fresh clone, a cache miss (the mirror) and a
cache hit (the snapshot) give the agent, the install commands and the tests the same tags, those
of the base commit and its ancestors, and nothing of the fix's."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import pytest

from evaluations.cache.store import Store
from tests.helpers.gitrepos import git
from tests.helpers.runtimes import REGISTRIES
from tests.helpers.tasks import ADD_TEST, BUGGY, FIXED
from tests.pipeline.test_e2e import evaluate

pytestmark = pytest.mark.django_db(transaction=True)

# The install step records what `git describe` said (in HOME, which a snapshot keeps).
INSTALL = ['git describe --tags --long > "$HOME/described"', 'git tag > "$HOME/tags-at-install"']
DESCRIBED_TEST = """\
#!/bin/bash
set -e
now=$(git describe --tags --long --exclude 'agent-*')
test "$now" = "$(cat "$HOME/described")" || { echo "described $now, at install $(cat "$HOME/described")"; exit 1; }
echo "described-ok $now"
"""
# The agent reports its repository's tags (and tries the future's), then solves the task.
PROBE = """
import json, os, pathlib, subprocess
def git(*args):
    return subprocess.run(['git', *args], capture_output=True, text=True)
seen = {
    'refs': git('for-each-ref', '--format=%(objectname) %(objecttype) %(refname)').stdout.splitlines(),
    'described': git('describe', '--tags', '--long').stdout.strip(),
    'at_install': (pathlib.Path(os.environ['HOME']) / 'described').read_text().strip(),
    'tags_at_install': (pathlib.Path(os.environ['HOME']) / 'tags-at-install').read_text().split(),
    'commits': sorted(git('rev-list', '--all', '--reflog').stdout.split()),
    'future': {oid: git('cat-file', '-e', oid).returncode for oid in os.environ['FUTURE'].split()},
}
print('SEEN ' + json.dumps(seen))
git('tag', 'agent-own-tag')  # the agent's own tag: its copy only
f = pathlib.Path('calc.py'); f.write_text(f.read_text().replace('a - b', 'a + b'))
"""


def _seen(evaluation) -> dict:
    line = next(line for line in evaluation.agent_output.splitlines() if line.startswith("SEEN "))
    return json.loads(line[5:])


def _passed(evaluation) -> None:
    assert (evaluation.status, evaluation.error) == ("completed", ""), (
        evaluation.error + evaluation.test_output[-2000:] + evaluation.log[-3000:]
    )


def _tagged_task(tasks):
    """v0.9 (annotated) on the first commit, v1.0 (annotated) on the second, the base one after it;
    the fix tagged v1.1 (annotated, its message telling the fix) and fix-light."""
    repo_url, (first, release, base, fix) = tasks.repo(
        [
            {"calc.py": BUGGY, ":tag": "v0.9"},
            {"notes.txt": "1.0\n", ":tag": "v1.0"},
            {"notes.txt": "after 1.0\n"},
            {"calc.py": FIXED, ":tag": "v1.1", ":message": "fix add()"},
        ]
    )
    work = tasks.www.parent / "work" / repo_url.rsplit("/", 1)[1].removesuffix(".git")
    tags = {name: git(work, "rev-parse", f"refs/tags/{name}") for name in ("v0.9", "v1.0", "v1.1")}
    yaml = f"repo: {repo_url}\nbase_commit: {base}\ninstall:\n" + "".join(f"  - {c!r}\n" for c in INSTALL)
    url = tasks.task(
        workspace=yaml, tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_described.sh": DESCRIBED_TEST}
    )
    return url, base, [first, release, base], tags, fix


def test_a_fresh_clone_a_cache_miss_and_a_cache_hit_keep_the_same_tags(tasks, e2e_config, sandbox):
    if os.geteuid() != 0:
        pytest.skip("the workspace cache needs root (idmapped mounts)")
    url, base, past, tags, fix = _tagged_task(tasks)
    env = {"FUTURE": f"{fix} {tags['v1.1']}"}
    cold = dataclasses.replace(e2e_config, workspace_cache="off")
    runs = [
        evaluate(url, PROBE, config=cold, sandbox=sandbox, env=env),
        evaluate(url, PROBE, config=e2e_config, sandbox=sandbox, env=env),
        evaluate(url, PROBE, config=e2e_config, sandbox=sandbox, env=env),
    ]
    for evaluation in runs:
        _passed(evaluation)
        assert "described-ok v1.0-1-g" in evaluation.test_output
    assert [e.cache for e in runs] == ["off", "miss", "hit"]
    seen = [_seen(e) for e in runs]
    assert seen[0] == seen[1] == seen[2]
    first = seen[0]
    assert first["refs"] == [f"{tags['v0.9']} tag refs/tags/v0.9", f"{tags['v1.0']} tag refs/tags/v1.0"]
    assert first["described"] == first["at_install"] and first["described"].startswith("v1.0-1-g")
    assert first["tags_at_install"] == ["v0.9", "v1.0"]
    assert first["commits"] == sorted(past)
    assert all(code != 0 for code in first["future"].values()), first["future"]
    # The agent's own tag stayed in its copy: the hit after it saw none.
    store = Store(e2e_config.cache_root)
    (entry,) = store.all_entries()
    assert git(entry.folder("repo"), "tag") == "v0.9\nv1.0"
    (mirror,) = store.mirror_names()
    assert "v1.1" in git(store.mirrors / mirror, "tag")  # the mirror holds the future; no evaluation sees it
    assert subprocess.run(["git", "cat-file", "-e", fix], cwd=store.mirrors / mirror).returncode == 0


SCM_PYPROJECT = """\
[build-system]
requires = ["setuptools>=64", "setuptools_scm>=8"]
build-backend = "setuptools.build_meta"

[project]
name = "scmpkg"
dynamic = ["version"]

[tool.setuptools]
packages = ["scmpkg"]

[tool.setuptools_scm]
"""
SCM_TEST = """\
#!/bin/bash
set -e
version=$(python -c 'import importlib.metadata as m; print(m.version("scmpkg"))')
echo "installed as $version"
test "${version%%+*}" = "$EXPECTED_VERSION"  # 1.4.1.dev1+g<commit>: the release's next version, a dev of it
"""
SCM_SOLVER = """\
import pathlib
f = pathlib.Path('scmpkg/__init__.py')
f.write_text(f.read_text().replace('a - b', 'a + b'))
"""


@pytest.mark.slow
@pytest.mark.parametrize(("at", "version"), [("release", "1.4.0"), ("after", "1.4.1.dev1")])
def test_a_setuptools_scm_project_installs_as_its_release(tasks, e2e_config, at, version):
    """setuptools_scm (from PyPI) reads the version from the tags, as pytest, xarray, astropy and
    matplotlib do: with them gone it would be 0.1.devN. On a cache hit too."""
    config = dataclasses.replace(e2e_config, install_timeout_secs=300, egress_allow=REGISTRIES)
    repo_url, (release, after, fix) = tasks.repo(
        [
            {"pyproject.toml": SCM_PYPROJECT, "scmpkg/__init__.py": BUGGY, ":tag": "v1.4.0"},
            {"notes.txt": "after 1.4.0\n"},
            {"scmpkg/__init__.py": FIXED, ":tag": "v1.5.0"},
        ]
    )
    base = {"release": release, "after": after}[at]
    yaml = (
        f"repo: {repo_url}\nbase_commit: {base}\ninstall:\n  - pip install -e .\n"
        f"env:\n  EXPECTED_VERSION: '{version}'\n"
    )
    url = tasks.task(
        workspace=yaml,
        tests={
            "fail_to_pass_add.sh": "python -c 'import scmpkg; assert scmpkg.add(2, 3) == 5'\n",
            "pass_to_pass_version.sh": SCM_TEST,
        },
    )
    runs = [evaluate(url, SCM_SOLVER, config=config, sandbox="bwrap") for _ in range(2)]
    for evaluation in runs:
        _passed(evaluation)
        assert f"installed as {version}" in evaluation.test_output
    if os.geteuid() == 0:
        assert [e.cache for e in runs] == ["miss", "hit"]
