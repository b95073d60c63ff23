"""Install recipes per repository and version, each row's environment, SWE-bench's image names (SPEC §19):
the recipe functions on their own (their shell commands run by a real bash), then `import_swebench` with
--specs, --environment-for and --image-template on rows of repositories served on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from evaluations.importers import recipes
from evaluations.importers.build import Options
from evaluations.importers.rows import Instance
from tests.helpers.runtimes import REGISTRIES
from tests.helpers.swebench import write_jsonl
from tests.importers.test_verify_tasks import bubblewrap  # noqa: F401  (the fixture)


def instance(repo: str = "owner/calc", version: str | None = "1.0", **fields) -> Instance:
    return Instance("owner__calc-1", repo, "0" * 40, "", "patch", "problem", ["t::a"], [], version=version, **fields)


def bash(command: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], **env})  # fmt: skip


# -- SWE-bench's specifications -------------------------------------------------------------------


def test_swebench_specifications_are_read_and_become_pip_installs_env_and_the_test_command():
    specs = recipes.swebench_specs()
    assert len(specs) == 20 and sum(len(versions) for versions in specs.values()) == 300
    assert specs["django/django"]["3.0"]["python"] == "3.6"

    django = recipes.recipe_for(instance("django/django", "3.0"), Options())
    assert django.python == "3.6"
    assert django.install == ["python -m pip install -r tests/requirements/py3.txt", "python -m pip install -e ."]
    assert django.env == {"LANG": "en_US.UTF-8", "LANGUAGE": "en_US:en", "LC_ALL": "en_US.UTF-8"}
    assert django.test_cmd == (
        "{ sed -i '/en_US.UTF-8/s/^# //g' /etc/locale.gen && locale-gen; true; } && "
        "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1"
    )
    assert django.note is None

    sklearn = recipes.recipe_for(instance("scikit-learn/scikit-learn", "0.20"), Options())
    assert (sklearn.python, sklearn.test_cmd) == ("3.6", "pytest -rA")
    assert sklearn.install == [
        "python -m pip install numpy scipy cython pytest pandas matplotlib",  # conda's packages, by pip
        "python -m pip install cython numpy==1.19.2 setuptools scipy==1.5.2",
        "python -m pip install -v --no-use-pep517 --no-build-isolation -e .",
    ]

    xarray = recipes.recipe_for(instance("pydata/xarray", "0.12"), Options())
    assert xarray.install[-1] == "python -m pip install -e ." and "dask==2022.8.1" in xarray.install[0]
    assert xarray.note == (
        "the install recipe for pydata/xarray 0.12 takes its packages from a conda environment.yml, which is "
        "not installed here: the rest of the recipe is (--install overrides it)"
    )


def test_precedence_options_then_the_rows_own_then_specs_file_then_swebench_then_defaults():
    mine = {"pallets/flask": {"2.3": {"python": "3.12", "install": ["make"], "test_cmd": ["a", "b"]}}}
    flask = instance("pallets/flask", "2.3")
    assert recipes.recipe_for(flask, Options(specs=mine)) == recipes.Recipe("3.12", ["make"], "a && b")
    # Other versions of the repository are still SWE-bench's.
    assert recipes.recipe_for(instance("pallets/flask", "2.2"), Options(specs=mine)).python == "3.11"
    own = instance("pallets/flask", "2.3", install=["pip install ."], test_cmd="python -m unittest")
    assert recipes.recipe_for(own, Options(specs=mine)) == recipes.Recipe(
        "3.12", ["pip install ."], "python -m unittest"
    )
    forced = Options(specs=mine, install=("true",), test_cmd="pytest -x")
    assert recipes.recipe_for(own, forced) == recipes.Recipe("3.12", ["true"], "pytest -x")

    unknown = recipes.recipe_for(instance("owner/calc", "9.9"), Options())
    assert unknown == recipes.Recipe(
        None,
        ["pip install -e ."],
        "python -m pytest -rA -p no:cacheprovider",
        note="no install recipe for owner/calc 9.9: the row's own install and test_cmd, else the defaults",
    )
    assert recipes.recipe_for(instance("owner/calc", None), Options()).note.startswith(
        "no install recipe for owner/calc (no version):"
    )
    assert recipes.recipe_for(instance("owner/calc", "9.9"), Options(install=("x",), test_cmd="y")).note is None


def test_the_recipes_shell_commands_run_as_swebench_runs_them(tmp_path):
    """requirements files found in order, pip packages quoted, pre_install as one script (a variable set
    by one line is there for the next, a failing line stops it), eval_commands' failures ignored."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text('#!/bin/bash\nprintf "%s|" "$@" >> "$CALLS"; echo >> "$CALLS"\n')
    (bin_dir / "python").chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls)}
    spec = {
        "python": "3.9",
        "packages": "requirements.txt",
        "pip_packages": ["pandas<2.0.0", "numpy==1.25.2"],
        "pre_install": ['TARGET="made by pre_install"', 'echo "$TARGET" > pre.txt'],
        "install": "python -m pip install -e .",
        "eval_commands": ["export LANG=C.UTF-8", "export GREETING='a b'", "false", "echo ran > eval.txt"],
        "test_cmd": "echo tests ran",
    }
    recipe = recipes.recipe_for(instance("sympy/sympy", "1.1"), Options(specs={"sympy/sympy": {"1.1": spec}}))
    assert recipe.env == {"LANG": "C.UTF-8", "GREETING": "a b"}
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "requirements-test.txt").write_text("pytest\n")  # sympy's second candidate; not the first
    for command in recipe.install:
        done = bash(command, repo, **env)
        assert done.returncode == 0, (command, done.stderr)
    assert calls.read_text().splitlines() == [
        "-m|pip|install|-r|requirements-test.txt|",
        "-m|pip|install|pandas<2.0.0|numpy==1.25.2|",
        "-m|pip|install|-e|.|",
    ]
    assert (repo / "pre.txt").read_text() == "made by pre_install\n"
    tests = bash(recipe.test_cmd, repo, **env)
    assert (tests.returncode, tests.stdout) == (0, "tests ran\n") and (repo / "eval.txt").is_file()

    (repo / "requirements-test.txt").unlink()
    missing = bash(recipe.install[0], repo, **env)
    assert missing.returncode == 1
    assert missing.stderr == "none of requirements-dev.txt, requirements-test.txt is in the repository\n"
    stops = recipes.recipe_for(
        instance("owner/calc"), Options(specs={"owner/calc": {"1.0": {"pre_install": ["false", "touch reached"]}}})
    )
    assert bash(stops.install[0], repo).returncode == 1 and not (repo / "reached").exists()


def test_image_template_names_images_as_swebench_does_and_runs_tests_in_testbed():
    assert (
        recipes.image_for("swebench/sweb.eval.x86_64.{id}:latest", "Django__django-11099")
        == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    )
    options = Options(image_template="swebench/sweb.eval.x86_64.{id}:latest")
    django = recipes.recipe_for(instance("django/django", "3.0"), options)
    assert django.install == []  # the image holds the installed environment
    assert django.test_cmd.startswith("source /opt/miniconda3/bin/activate && conda activate testbed && { sed ")
    assert django.test_cmd.endswith("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1")
    overridden = recipes.recipe_for(instance(), Options(image_template="x/{id}", install=("make",), test_cmd="t"))
    assert (overridden.install, overridden.test_cmd) == (["make"], f"{recipes.TESTBED_ACTIVATE} && t")
    assert overridden.note is None
    assert recipes.environment_for(instance(), overridden, Options(image_template="x/{id}")) == {
        "image": "x/owner_1776_calc-1"
    }


# -- bad input, each with its sentence ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "SPECS is not JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
        ("[]", 'SPECS must be a JSON object of repositories ({"owner/name": {"VERSION": {...}}}), not a list'),
        ('{"a/b": ["1.0"]}', "SPECS: a/b must be an object of versions, not a list"),
        ('{"a/b": {"1.0": "pip install"}}',
         "SPECS: a/b 1.0 must be an object (python, packages, install, test_cmd...), not a string"),
        ('{"a/b": {"1.0": {"pip_package": ["x"]}}}',
         "SPECS: a/b 1.0: unknown key 'pip_package' (known: python, packages, pip_packages, pre_install, install, "
         "test_cmd, env, eval_commands)"),
        ('{"a/b": {"1.0": {"python": 3.9}}}', "SPECS: a/b 1.0: 'python' must be a Python version as a string, such "
         'as "3.9"'),
        ('{"a/b": {"1.0": {"python": "three"}}}', "SPECS: a/b 1.0: 'python' must be a Python version as a string"),
        ('{"a/b": {"1.0": {"pip_packages": "numpy"}}}', "SPECS: a/b 1.0: 'pip_packages' must be a list of strings, "
         "not a string"),
        ('{"a/b": {"1.0": {"pre_install": [1]}}}', "SPECS: a/b 1.0: 'pre_install' must be a string, not a number"),
        ('{"a/b": {"1.0": {"install": {"x": 1}}}}',
         "SPECS: a/b 1.0: 'install' (a string or a list of strings) must be a string, not an object"),
        ('{"a/b": {"1.0": {"test_cmd": "a\\u0000b"}}}',
         "SPECS: a/b 1.0: 'test_cmd' (a string or a list of strings) contains a NUL byte"),
        ('{"a/b": {"1.0": {"env": {"lower": "x"}}}}',
         "SPECS: a/b 1.0: 'env': 'lower' is not a variable name ([A-Z_][A-Z0-9_]*)"),
        ('{"a/b": {"1.0": {"env": {"A": 1}}}}', "SPECS: a/b 1.0: 'env': A must be a string, not a number"),
        ('{"a/b": {"1.0": {"env": ["A=1"]}}}',
         "SPECS: a/b 1.0: 'env' must be an object of variable names to strings"),
    ],
)  # fmt: skip
def test_a_bad_specs_file_is_refused_naming_the_key(tmp_path, text, message):
    path = tmp_path / "specs.json"
    path.write_text(text)
    with pytest.raises(recipes.SpecsError) as refused:
        recipes.load_specs(path)
    assert str(refused.value).replace(str(path), "SPECS").startswith(message), str(refused.value)


def test_swebench_keys_for_its_own_docker_builds_are_accepted_and_unused(tmp_path):
    path = tmp_path / "specs.json"
    path.write_text(json.dumps({"a/b": {"1.0": {"python": "3.9", "nano_cpus": 2, "docker_specs": {"x": 1},
                                                "execute_test_as_nonroot": True, "no_use_env": True}}}))  # fmt: skip
    assert recipes.load_specs(path)["a/b"]["1.0"]["python"] == "3.9"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["3.9"], "--environment-for '3.9': expected PYVER=NAME_OR_IMAGE, such as 3.9=py39 or 3.9=python:3.9"),
        (["3.9="], "--environment-for '3.9=': expected PYVER=NAME_OR_IMAGE"),
        (["three=py3"], "--environment-for 'three=py3': 'three' is not a Python version such as 3.9"),
        (["3=py3"], "--environment-for '3=py3': '3' is not a Python version such as 3.9"),
        (["3.9=Py39"], "--environment-for '3.9=Py39': environment name 'Py39' is not valid: lowercase letters, "
         "digits, '.', '_' and '-', starting with a letter or a digit (an image reference has a '/' or a ':')"),
        (["3.9=registry.example/Py:3.9"], "--environment-for '3.9=registry.example/Py:3.9': The image reference"),
        (["3.9=py39", "3.9=python:3.9"], "--environment-for: python 3.9 is given twice"),
    ],
)  # fmt: skip
def test_a_bad_environment_for_is_refused(values, message):
    with pytest.raises(recipes.OptionError) as refused:
        recipes.parse_environment_for(values)
    assert str(refused.value).startswith(message), str(refused.value)


def test_environment_for_takes_names_and_image_references():
    chosen = recipes.parse_environment_for(["3.9=py39", "3.11=python:3.11-slim", "3.6=registry.example/py/3.6"])
    assert chosen == {"3.9": "py39", "3.11": {"image": "python:3.11-slim"}, "3.6": {"image": "registry.example/py/3.6"}}


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("swebench/sweb.eval.x86_64:latest", "--image-template must contain {id} (the instance id, as SWE-bench "
         "names its images)"),
        ("swebench/{repo}.{id}:latest", "--image-template: unknown placeholder {repo}; only {id} is replaced"),
        ("SWEbench/sweb.eval.{id}:latest", "--image-template 'SWEbench/sweb.eval.{id}:latest' does not give an "
         "image reference: The image reference"),
        ("swebench/{id}:latest:x", "--image-template 'swebench/{id}:latest:x' does not give an image reference"),
    ],
)  # fmt: skip
def test_a_bad_image_template_is_refused(template, message):
    with pytest.raises(recipes.OptionError) as refused:
        recipes.check_image_template(template)
    assert str(refused.value).startswith(message), str(refused.value)


# -- the command -------------------------------------------------------------------------------------


CALC_SPECS = {
    "owner/calc": {
        "1.0": {
            "python": "3.9",
            "pip_packages": ["pytest<9"],
            "install": "python -m pip install -e .",
            "test_cmd": "pytest -rA",
            "env": {"CALC_MODE": "strict"},
        },
        "2.0": {"python": "3.11", "test_cmd": "pytest -rA"},
    }
}


def test_specs_and_environment_for_choose_each_rows_install_and_environment(cli, served, tmp_path):
    instances, _server, template = served
    rows = [
        instances.make("owner__calc-1"),  # 1.0: python 3.9
        instances.make("owner__calc-2", version="2.0"),  # python 3.11
        instances.make("owner__calc-3", version="3.0"),  # no recipe: python not known
        instances.make("owner__calc-4", version="3.0"),
    ]
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps(CALC_SPECS))
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "out"
    done = cli.manage("import_swebench", str(path), "--out", str(out), "--repo-url", template, "--specs", str(specs),
                      "--environment-for", "3.9=py39", "--environment-for", "3.11=registry.example/py:3.11")  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "skipped owner__calc-3: no environment for python of this row: no install recipe gives its version "
        "(--environment names one for such rows)",
        "skipped owner__calc-4: no environment for python of this row: no install recipe gives its version "
        "(--environment names one for such rows)",
    ]
    note = "note: no install recipe for owner/calc 3.0: the row's own install and test_cmd, else the defaults"
    assert note not in done.stdout  # the rows are skipped: their sentence says it
    assert done.stdout.splitlines()[-1] == (
        f"imported 2 task(s) into {out}, skipped 2 (2 with no environment for their python)"
    )
    first = yaml.safe_load((out / "owner__calc-1" / "workspace.yaml").read_text())
    assert first["install"] == ["python -m pip install 'pytest<9'", "python -m pip install -e ."]
    assert (first["env"], first["environment"]) == ({"CALC_MODE": "strict"}, "py39")
    assert first["swebench"]["test_cmd"] == "pytest -rA"  # the recipe's, graded as SWE-bench grades
    assert "tests/test_add.py::test_add[2 + 3]" in first["swebench"]["fail_to_pass"]
    second = yaml.safe_load((out / "owner__calc-2" / "workspace.yaml").read_text())
    assert second["environment"] == {"image": "registry.example/py:3.11"} and second["install"] == []
    index = json.loads((out / "index.json").read_text())
    assert [t["instance_id"] for t in index["tasks"]] == ["owner__calc-1", "owner__calc-2"]
    assert [s["row"] for s in index["skipped"]] == ["owner__calc-3", "owner__calc-4"]
    assert index["skipped"][0]["reason"].startswith("no environment for python of this row")

    # --environment is for the rows whose Python is not known; a known version with no environment is
    # skipped, never run on another one.
    again = cli.manage("import_swebench", str(path), "--out", str(out), "--repo-url", template, "--specs", str(specs),
                       "--environment-for", "3.9=py39", "--environment", "tools")  # fmt: skip
    assert again.returncode == 1, again.stdout + again.stderr
    assert again.stderr == "skipped owner__calc-2: no environment for python 3.11\n"
    assert yaml.safe_load((out / "owner__calc-3" / "workspace.yaml").read_text())["environment"] == "tools"
    assert again.stdout.count(note) == 1  # said once for the two rows
    assert again.stdout.splitlines()[-1].endswith("skipped 1 (1 with no environment for their python)")
    assert json.loads((out / "index.json").read_text())["skipped"] == [
        {"row": "owner__calc-2", "reason": "no environment for python 3.11"}
    ]


def test_bad_options_are_exit_2_with_their_sentence_and_nothing_written(cli, tmp_path):
    rows = write_jsonl(tmp_path / "rows.jsonl", [])
    out = tmp_path / "out"
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"a/b": {"1.0": {"python": 3.9}}}')
    cases = {
        ("--specs", str(tmp_path / "nope.json")): f"--specs {tmp_path}/nope.json: no such file",
        ("--specs", str(bad_json)): f"--specs {bad_json}: a/b 1.0: 'python' must be a Python version as a string, "
        'such as "3.9"',
        ("--environment-for", "3.9"): "--environment-for '3.9': expected PYVER=NAME_OR_IMAGE",
        ("--image-template", "swebench/x:latest"): "--image-template must contain {id}",
        ("--image-template", "x/{id}", "--environment", "tools"): "--image-template gives every row its environment: "
        "it does not go with --environment or --environment-for",
        ("--image-template", "x/{id}", "--environment-for", "3.9=py39"): "--image-template gives every row its",
    }
    for args, message in cases.items():
        done = cli.manage("import_swebench", str(rows), "--out", str(out), *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stderr, (args, done.stderr)
    assert not out.exists()


def test_image_template_tasks_have_no_repo_and_a_row_whose_id_makes_no_image_is_skipped(cli, served, tmp_path):
    instances, _server, template = served
    rows = [instances.make("Owner__calc-1"), instances.make("owner__calc+2")]
    out = tmp_path / "out"
    done = cli.manage("import_swebench", str(write_jsonl(tmp_path / "rows.jsonl", rows)), "--out", str(out),
                      "--repo-url", template, "--image-template", "registry.example/sweb.eval.x86_64.{id}:latest")  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith(
        "skipped owner__calc+2: --image-template gives no image reference for this id: The image reference "
        "'registry.example/sweb.eval.x86_64.owner_1776_calc+2:latest'"
    )
    assert "note:" not in done.stdout  # the image's environment is the recipe when none is known
    workspace = yaml.safe_load((out / "Owner__calc-1" / "workspace.yaml").read_text())
    graded = workspace.pop("swebench")
    assert workspace == {
        "version": "1.0",
        "install": [],
        "environment": {"image": "registry.example/sweb.eval.x86_64.owner_1776_calc-1:latest"},
        "grader": "swebench",
        "patch": workspace["patch"],
    }
    assert graded["test_cmd"] == f"{recipes.TESTBED_ACTIVATE} && python -m pytest -rA -p no:cacheprovider"
    assert (out / "Owner__calc-1" / "tests" / "tests" / "test_add.py").is_file()  # support files, into /testbed


@pytest.mark.slow
@pytest.mark.usefixtures("bubblewrap")
def test_a_recipe_installs_through_the_proxy_and_its_env_reaches_the_tests(cli, served, debian_environment, tmp_path):
    """A --specs recipe for python 3.11, run in the environment --environment-for names for 3.11 (the
    suite's Debian tree): its pip_packages from PyPI through the egress proxy, its pre_install script,
    its variables (env and eval_commands' exports) in the test command; gold passes, no-op fails."""
    instances, _server, template = served
    row = instances.make("owner__calc-1")
    recipe = {
        "python": "3.11",
        "pip_packages": ["pytest>=7"],
        "pre_install": ['MARK="pre_install ran"', 'echo "$MARK" > "$HOME/mark.txt"'],
        "env": {"CALC_MODE": "strict"},
        "eval_commands": ["export CALC_LANG=C.UTF-8"],
        "test_cmd": 'test "$CALC_MODE:$CALC_LANG" = strict:C.UTF-8 && grep -q "pre_install ran" "$HOME/mark.txt" '
        "&& python -m pytest -rA -p no:cacheprovider",
    }
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps({"owner/calc": {"1.0": recipe}}))
    cli.migrate()
    cli.env.update(EGRESS_ALLOW=",".join(REGISTRIES), ENVIRONMENTS_ROOT=str(debian_environment.root.parent))
    out = tmp_path / "out"
    done = cli.manage("import_swebench", str(write_jsonl(tmp_path / "rows.jsonl", [row])), "--out", str(out),
                      "--repo-url", template, "--specs", str(specs), "--environment-for",
                      f"3.11={debian_environment.name}", "--verify", timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    workspace = yaml.safe_load((out / "owner__calc-1" / "workspace.yaml").read_text())
    assert workspace["environment"] == debian_environment.name
    assert workspace["env"] == {"CALC_LANG": "C.UTF-8", "CALC_MODE": "strict"}
    runs = json.loads((out / "verification.json").read_text())["tasks"][0]
    assert runs["verified"] is True, runs
    gold = runs["gold"]["tests"]  # one row per id, graded from the log (SPEC §19)
    assert gold and all(t["passed"] for t in gold) and {t["kind"] for t in gold} == {"fail_to_pass", "pass_to_pass"}
