"""SWE-Forge task folders (SPEC §19): workspace.yaml's test commands, install_config, difficulty, patch and
prompt read by load_task; LANGUAGE_ENVIRONMENTS read at start; a task's language choosing its toolchain."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from django.conf import settings

from evaluations.tasks.language import NoToolchain, with_toolchain
from evaluations.tasks.registry import load_task
from evaluations.tasks.spec import ImageEnvironment, TaskError
from executor_project.config import ConfigError
from executor_project.settings_loader import load
from tests.helpers.environments import executable, fake_environment
from tests.tasks.test_workspace import make_task

PATCH = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-a - b\n+a + b\n"
FORGE_YAML = f"""repo: https://github.com/org/repo.git
base_commit: 1a2b3c4d
language: python
fail_to_pass:
  - python3 -m pytest tests/test_fix.py
  - "test -f calc.py && grep -q 'a + b' calc.py"
pass_to_pass:
  - python3 -m pytest tests/test_old.py
install_config:
  install: pip install -e .
  python: 3.10
  node: "20"
difficulty: hard
difficulty_score: 3
prompt: |
  Make add() add.
patch: {json.dumps(PATCH)}
"""


def forge_task(tmp_path, text: str = FORGE_YAML, **files: str):
    return make_task(tmp_path / "task", {"workspace.yaml": text, **files})


def forge_error(tmp_path, extra: str, **kwargs) -> str:
    with pytest.raises(TaskError) as info:
        load_task(forge_task(tmp_path, "repo: https://github.com/org/repo.git\nbase_commit: abc\n" + extra), **kwargs)
    return str(info.value)


# -- the keys ----------------------------------------------------------------------------------------


def test_a_swe_forge_folder_reads_its_commands_install_prompt_patch_and_metadata(tmp_path):
    task = load_task(forge_task(tmp_path))
    assert [(t.name, t.kind, t.script, t.command) for t in task.tests] == [
        ("fail_to_pass_1", "fail_to_pass", None, "python3 -m pytest tests/test_fix.py"),
        ("fail_to_pass_2", "fail_to_pass", None, "test -f calc.py && grep -q 'a + b' calc.py"),
        ("pass_to_pass_1", "pass_to_pass", None, "python3 -m pytest tests/test_old.py"),
    ]
    assert task.tests[1].source == "workspace.yaml fail_to_pass 2"
    assert task.install == ["pip install -e ."]
    assert task.prompt == "Make add() add.\n"
    assert task.patch == PATCH
    # Kept in task_metadata, the Python version as written (3.10, not 3.1); never the patch.
    assert task.metadata == {
        "difficulty": "hard",
        "difficulty_score": 3,
        "install_config": {"install": "pip install -e .", "python": "3.10", "node": "20"},
    }
    assert task.format == "workspace" and task.solution is None


def test_prompt_md_install_tests_and_checks_win_over_the_yaml_keys(tmp_path):
    root = forge_task(
        tmp_path,
        FORGE_YAML + "install: [make deps]\n",
        **{"prompt.md": "From prompt.md.\n", "tests/fail_to_pass_x.sh": "true\n"},
    )
    task = load_task(root)
    assert task.prompt == "From prompt.md.\n"
    assert task.install == ["make deps"]
    assert [t.name for t in task.tests] == ["fail_to_pass_x"]  # the scripts; the commands are not used
    checks = load_task(forge_task(tmp_path / "c", FORGE_YAML + "install: []\n", **{"checks.txt": "true\n"}))
    assert [t.name for t in checks.tests] == ["check_1"] and checks.install == []


def test_install_config_install_may_be_a_list_and_a_workspace_task_without_the_keys_has_no_metadata(tmp_path):
    listed = load_task(forge_task(tmp_path / "a", forge_yaml(install_config="{install: [make deps, make]}")))
    assert listed.install == ["make deps", "make"]
    plain = load_task(make_task(tmp_path / "b", {"workspace.yaml": "repo: https://h/r.git\nbase_commit: a\n",
                                                 "prompt.md": "x"}))  # fmt: skip
    assert (plain.metadata, plain.patch, plain.tests) == (None, None, [])


def forge_yaml(**replace: str) -> str:
    """FORGE_YAML with some top-level keys' values replaced (a value of None drops the key)."""
    lines, skipping = [], False
    for line in FORGE_YAML.splitlines(keepends=True):
        key = line.split(":", 1)[0] if not line.startswith(" ") else None
        if key is not None:
            skipping = key in replace
            if skipping and replace[key] is not None:
                lines.append(f"{key}: {replace[key]}\n")
        if not skipping:
            lines.append(line)
    return "".join(lines)


def test_the_commands_count_against_max_tests(tmp_path):
    assert len(load_task(forge_task(tmp_path / "a"), max_tests=3).tests) == 3
    with pytest.raises(TaskError) as info:
        load_task(forge_task(tmp_path / "b"), max_tests=2)
    assert str(info.value) == (
        "workspace.yaml: 'pass_to_pass' command 1 is test 3, over the cap of 2 tests (MAX_TESTS)"
    )


def test_a_yaml_prompt_is_held_to_the_instruction_cap_and_one_is_needed(tmp_path):
    with pytest.raises(TaskError) as info:
        load_task(forge_task(tmp_path / "a"), max_prompt_bytes=10)
    assert str(info.value) == "workspace.yaml: 'prompt' is larger than 10 bytes (MAX_PROMPT_BYTES)"
    with pytest.raises(TaskError) as info:
        load_task(forge_task(tmp_path / "b", forge_yaml(prompt=None)))
    assert str(info.value) == "task has no prompt.md (required unless workspace.yaml has 'prompt')"


@pytest.mark.parametrize(
    "extra, message",
    [
        ("fail_to_pass: pytest\n", "workspace.yaml: 'fail_to_pass' must be a list of shell commands, not a string"),
        ("pass_to_pass: {a: b}\n", "workspace.yaml: 'pass_to_pass' must be a list of shell commands, not dict"),
        ("fail_to_pass: [true, 3]\n", "workspace.yaml: 'fail_to_pass' command 1 must be a string, not a boolean"),
        ("pass_to_pass: [ok, '  ']\n", "workspace.yaml: 'pass_to_pass' command 2 is empty"),
        ('fail_to_pass: ["a\\0b"]\n', "workspace.yaml: 'fail_to_pass' command 1 contains a NUL byte"),
        ("install_config: pip install\n", "workspace.yaml: 'install_config' must be a mapping of names to strings "
                                          "(install, python...), not a string"),
        ("install_config: {python: [3]}\n", "workspace.yaml: 'install_config': 'python' must be a string, not a list"),
        ("install_config: {python: three}\n", "workspace.yaml: 'install_config': 'python' must be a Python version "
                                              "such as 3.11, got 'three'"),
        ("install_config: {install: ''}\n", "workspace.yaml: 'install_config': 'install' is empty"),
        ("install_config: {install: [make, 3]}\n", "workspace.yaml: 'install_config': 'install' must be a command "
                                                   "or a list of commands (non-empty strings)"),
        ("install_config: {3: x}\n", "workspace.yaml: 'install_config': its keys must be names (install, python...), "
                                     "got 3"),
        ("difficulty: 3\n", "workspace.yaml: 'difficulty' must be a word such as easy, medium or hard, not a number"),
        ("difficulty: ' '\n", "workspace.yaml: 'difficulty' must be a word such as easy, medium or hard, "
                              "not a string"),
        ("difficulty_score: 2.5\n", "workspace.yaml: 'difficulty_score' must be a whole number from 0 to 255, "
                                    "got 2.5"),
        ("difficulty_score: 256\n", "workspace.yaml: 'difficulty_score' must be a whole number from 0 to 255, "
                                    "got 256"),
        ("difficulty_score: true\n", "workspace.yaml: 'difficulty_score' must be a whole number from 0 to 255, "
                                     "got a boolean"),
        ("difficulty_score: hard\n", "workspace.yaml: 'difficulty_score' must be a whole number from 0 to 255, "
                                     "got 'hard'"),
        ("patch: [a]\n", "workspace.yaml: 'patch' must be a string (a diff of the repository), not a list"),
        ("patch: ''\n", "workspace.yaml: 'patch' is empty (leave the key out when the task has no reference "
                        "solution)"),
        ('patch: "a\\0"\n', "workspace.yaml: 'patch' contains a NUL byte"),
        ("prompt: 42\n", "workspace.yaml: 'prompt' must be a string (the agent's instruction), not a number"),
        ('prompt: "a\\0"\n', "workspace.yaml: 'prompt' contains a NUL byte"),
    ],
)  # fmt: skip
def test_each_bad_key_is_named(tmp_path, extra, message):
    assert forge_error(tmp_path, extra + "prompt: fallback\n" * ("prompt:" not in extra)) == message


# -- LANGUAGE_ENVIRONMENTS -----------------------------------------------------------------------


@pytest.fixture
def environments_root(tmp_path):
    base = tmp_path / "environments"
    tools = fake_environment(base, "tools")
    executable(tools / "usr" / "bin" / "go")
    fake_environment(base, "py39")
    return base


def test_language_environments_are_read(environments_root):
    config = load({"ENVIRONMENTS_ROOT": str(environments_root),
                   "LANGUAGE_ENVIRONMENTS": " Go=tools, rust=rust:1.80 ,python3.9=py39,java=localhost:5000/jdk@sha256:"
                                            + "a" * 64})  # fmt: skip
    assert config.language_environment == {
        "go": "tools", "rust": "rust:1.80", "python3.9": "py39", "java": f"localhost:5000/jdk@sha256:{'a' * 64}",
    }  # fmt: skip
    assert load({}).language_environments == ()


@pytest.mark.parametrize(
    "value, message",
    [
        ("go", "LANGUAGE_ENVIRONMENTS: entry 1 must be language=environment, got 'go'"),
        ("go=tools,rust=", "LANGUAGE_ENVIRONMENTS: entry 2 must be language=environment, got 'rust='"),
        ("cobol=tools", "LANGUAGE_ENVIRONMENTS: entry 1: unknown language 'cobol' (one of go, rust, javascript, "
                        "typescript, java, python, or pythonX.Y for a Python version)"),
        ("go=tools,GO=tools", "LANGUAGE_ENVIRONMENTS: the language 'go' is listed twice"),
        ("go=Tools", "LANGUAGE_ENVIRONMENTS: go: environment name 'Tools' is not valid: lowercase letters, digits, "
                     "'.', '_' and '-', starting with a letter or a digit (nor is it an image reference such as "
                     "golang:1.22)"),
        ("go=nope", "LANGUAGE_ENVIRONMENTS: go: unknown environment: nope (available: py39, tools)"),
        ("rust=rust:", "LANGUAGE_ENVIRONMENTS: rust: The image reference 'rust:' has an invalid tag '' (1 to 128 "
                       "of A-Z a-z 0-9 _ . -, not first . or -)."),
        ("java=jdk@sha256:abc", "LANGUAGE_ENVIRONMENTS: java: The image reference 'jdk@sha256:abc' has a digest "
                                "that is not sha256:<64 lower-case hex>."),
    ],
)  # fmt: skip
def test_bad_language_environments_stop_start_up_naming_the_entry(environments_root, value, message):
    with pytest.raises(ConfigError) as info:
        load({"ENVIRONMENTS_ROOT": str(environments_root), "LANGUAGE_ENVIRONMENTS": value})
    assert str(info.value) == message


def test_a_named_language_environment_needs_environments_root():
    with pytest.raises(ConfigError) as info:
        load({"LANGUAGE_ENVIRONMENTS": "go=tools"})
    assert str(info.value) == (
        "LANGUAGE_ENVIRONMENTS: go: environment tools needs ENVIRONMENTS_ROOT, the folder environments are in"
    )
    assert load({"LANGUAGE_ENVIRONMENTS": "go=golang:1.22"}).language_environment == {"go": "golang:1.22"}


# -- the task's language chooses its toolchain ---------------------------------------------------------


def config_with(**changes):
    return dataclasses.replace(settings.EXECUTOR, **changes)


def task_in(tmp_path, yaml: str):
    return load_task(forge_task(tmp_path, "repo: https://github.com/org/repo.git\nbase_commit: a\nprompt: x\n" + yaml))


def test_a_mapped_language_becomes_the_tasks_environment(tmp_path, environments_root):
    config = config_with(
        environments_root=environments_root,
        language_environments=(("go", "tools"), ("rust", "rust:1.80"), ("python3.9", "py39"), ("python", "tools")),
    )
    go = with_toolchain(task_in(tmp_path / "go", "language: Go\n"), config, "/nowhere")
    assert go.environment == "tools"
    rust = with_toolchain(task_in(tmp_path / "rust", "language: rust\n"), config, "/nowhere")
    assert rust.environment == ImageEnvironment(image="rust:1.80")
    # install_config's python chooses first for a Python task (3.9.18 is python3.9), then the language.
    py39 = task_in(tmp_path / "py39", "language: python\ninstall_config: {python: 3.9.18}\n")
    assert with_toolchain(py39, config, "/nowhere").environment == "py39"
    py311 = task_in(tmp_path / "py311", "install_config: {python: '3.11'}\nlanguage: python\n")
    assert with_toolchain(py311, config, "/nowhere").environment == "tools"
    # The task's own environment wins; an unmapped language without a toolchain is let be.
    own = task_in(tmp_path / "own", "language: go\nenvironment: py39\n")
    assert with_toolchain(own, config, "/nowhere").environment == "py39"
    ruby = task_in(tmp_path / "ruby", "language: ruby\n")
    assert with_toolchain(ruby, config, "/nowhere") is ruby


@pytest.mark.parametrize(
    "language, program", [("go", "go"), ("rust", "cargo"), ("javascript", "node"), ("typescript", "node"),
                          ("java", "javac")],
)  # fmt: skip
def test_an_unmapped_language_needs_its_program_on_the_commands_path(tmp_path, language, program):
    task = task_in(tmp_path / "t", f"language: {language}\n")
    empty, tools = tmp_path / "empty", tmp_path / "tools"
    empty.mkdir()
    executable(tools / program, "#!/bin/sh\n")
    config = config_with(default_environment=None)
    with pytest.raises(NoToolchain) as info:
        with_toolchain(task, config, f"{empty}:relative/bin")
    assert str(info.value) == (
        f"the task's language is {language} and this executor has no toolchain for it: LANGUAGE_ENVIRONMENTS maps "
        f"no environment to {language}, and the host has no {program} on the commands' PATH ({empty}:relative/bin)"
    )
    assert with_toolchain(task, config, f"{empty}:{tools}") is task


def test_an_unmapped_language_looks_in_the_default_environment(tmp_path, environments_root):
    config = config_with(environments_root=environments_root, default_environment="py39")
    task = task_in(tmp_path / "t", "language: go\n")
    with pytest.raises(NoToolchain) as info:
        with_toolchain(task, config, os.environ["PATH"])
    assert str(info.value) == (
        "the task's language is go and this executor has no toolchain for it: LANGUAGE_ENVIRONMENTS maps no "
        "environment to go, and environment py39 (DEFAULT_ENVIRONMENT) has no go"
    )
    with_go = dataclasses.replace(config, default_environment="tools")
    assert with_toolchain(task, with_go, "/nowhere") is task
