"""`import_swebench --image-template` on an image laid out as SWE-bench's are (SPEC §19): the repository at
/testbed at base_commit, a conda at /opt/miniconda3 whose `testbed` environment has the packages. The
image is the suite's Debian tree plus such a layer, pushed to the suite's registry on 127.0.0.1 under the
name the template gives; the tasks run through the pipeline with the gold patch and with a no-op agent."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers.gitrepos import git
from tests.helpers.images import push_image, tree_layer
from tests.helpers.swebench import write_jsonl
from tests.importers.test_verify_tasks import bubblewrap  # noqa: F401  (the fixture)

# A stand-in for conda's activate script: `conda activate NAME` puts that environment first on PATH
# (and fails with 3, a status no test command here gives, when there is no such environment).
ACTIVATE = """\
conda() {
  if [ "$1" = activate ] && [ -d "/opt/miniconda3/envs/$2/bin" ]; then
    export PATH="/opt/miniconda3/envs/$2/bin:$PATH" CONDA_DEFAULT_ENV="$2"
  else
    echo "conda: cannot $*" >&2
    return 3
  fi
}
"""
# The environment's python: the image's python3 with the environment's packages (pytest among them),
# which the image's own python3 does not have (the suite's Debian tree has no pytest).
TESTBED_PYTHON = """\
#!/bin/sh
export PYTHONPATH=/opt/miniconda3/envs/testbed/site-packages
exec /usr/bin/python3 "$@"
"""
PYTEST_DISTRIBUTIONS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")


def swebench_layer(tmp_path: Path, repo: Path, base_commit: str) -> bytes:
    """/testbed (a clone of ``repo`` at ``base_commit``, no remote) and /opt/miniconda3 as one layer."""
    tree = tmp_path / "layer"
    testbed = tree / "testbed"
    subprocess.run(["git", "clone", "--quiet", str(repo), str(testbed)], check=True)
    git(testbed, "checkout", "--quiet", base_commit)
    git(testbed, "remote", "remove", "origin")
    conda = tree / "opt" / "miniconda3"
    (conda / "bin").mkdir(parents=True)
    (conda / "bin" / "activate").write_text(ACTIVATE)
    env_bin = conda / "envs" / "testbed" / "bin"
    env_bin.mkdir(parents=True)
    (env_bin / "python").write_text(TESTBED_PYTHON)
    (env_bin / "python").chmod(0o755)
    site = conda / "envs" / "testbed" / "site-packages"
    site.mkdir()
    for name in PYTEST_DISTRIBUTIONS:  # pure Python: the host's copies, their metadata included
        distribution = importlib.metadata.distribution(name)
        for file in distribution.files:
            if "__pycache__" not in file.parts and not file.parts[0].startswith(".."):
                (site / file).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(distribution.locate_file(file), site / file)
    out = tmp_path / "swebench-layer.tar.gz"
    tree_layer(tree, out)
    return out.read_bytes()


@pytest.mark.slow
@pytest.mark.usefixtures("bubblewrap")
def test_tasks_of_an_image_template_run_in_testbed_gold_passes_and_the_noop_fails(
    cli, served, base_image, base_layer, seeded_images, tmp_path
):
    instances, _server, template = served
    registry, _ref, _digest = base_image
    row = instances.make("Owner__calc-1")
    image_layer = swebench_layer(tmp_path, instances.work / "Owner__calc-1", instances.shas[0])
    push_image(
        registry,
        "swebench/sweb.eval.x86_64.owner_1776_calc-1:latest",
        layers=[base_layer, image_layer],
        config={"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "WorkingDir": "/testbed"},
    )
    cli.migrate()
    cli.env.update(IMAGE_INSECURE_REGISTRIES=registry.host, IMAGES_DIR=str(seeded_images))
    out = tmp_path / "out"
    image_template = f"{registry.host}/swebench/sweb.eval.x86_64.{{id}}:latest"
    done = cli.manage("import_swebench", str(write_jsonl(tmp_path / "rows.jsonl", [row])), "--out", str(out),
                      "--repo-url", template, "--image-template", image_template, "--verify", timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    workspace = yaml.safe_load((out / "Owner__calc-1" / "workspace.yaml").read_text())
    assert "repo" not in workspace and workspace["install"] == []
    ref = f"{registry.host}/swebench/sweb.eval.x86_64.owner_1776_calc-1:latest"
    assert workspace["environment"] == {"image": ref}

    runs = json.loads((out / "verification.json").read_text())["tasks"][0]
    gold, noop = runs["gold"], runs["noop"]
    assert runs["verified"] is True, runs
    assert gold["tests"] and all(t["passed"] for t in gold["tests"])  # one row per id (SPEC §19)
    assert {(t["kind"], t["passed"]) for t in noop["tests"]} == {("fail_to_pass", False), ("pass_to_pass", True)}
    assert noop["error_kind"] == "tests_failed" and noop["failed_ids"], noop


@pytest.mark.slow
@pytest.mark.usefixtures("bubblewrap")
def test_an_image_without_the_testbed_environment_fails_its_tests_at_conda_activate(
    cli, served, base_image, base_layer, seeded_images, tmp_path
):
    """The same task on an image whose conda has no `testbed` environment: the test command stops at
    `conda activate testbed` (its status 3), never running with the image's own python."""
    instances, _server, template = served
    registry, _ref, _digest = base_image
    row = instances.make("owner__calc-2")
    swebench_layer(tmp_path, instances.work / "owner__calc-2", instances.shas[0])
    shutil.rmtree(tmp_path / "layer" / "opt" / "miniconda3" / "envs")
    broken = tmp_path / "broken.tar.gz"
    tree_layer(tmp_path / "layer", broken)
    push_image(
        registry,
        "swebench/sweb.eval.x86_64.owner_1776_calc-2:latest",
        layers=[base_layer, broken.read_bytes()],
        config={"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "WorkingDir": "/testbed"},
    )
    cli.migrate()
    cli.env.update(IMAGE_INSECURE_REGISTRIES=registry.host, IMAGES_DIR=str(seeded_images))
    out = tmp_path / "out"
    done = cli.manage("import_swebench", str(write_jsonl(tmp_path / "rows.jsonl", [row])), "--out", str(out),
                      "--repo-url", template, "--image-template", f"{registry.host}/swebench/sweb.eval.x86_64.{{id}}:latest",
                      "--verify", timeout=600)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    gold = json.loads((out / "verification.json").read_text())["tasks"][0]["gold"]
    assert gold["passed"] is False, gold
    # The command stopped at `conda activate` (its status 3): no test ran, every id is missing from the log.
    assert gold["tests"] and {t["exit_code"] for t in gold["tests"]} == {3}
    assert not any(t["passed"] for t in gold["tests"]) and gold["missing_ids"], gold
