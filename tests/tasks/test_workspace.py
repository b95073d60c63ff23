"""Task folder validation (SPEC section 4): workspace.yaml, prompt, checks, tests."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from evaluations.tasks.readers import MAX_YAML_BYTES
from evaluations.tasks.registry import load_task
from evaluations.tasks.spec import ImageEnvironment, SupportFile, TaskError, TestSpec

GOOD_YAML = "repo: https://github.com/org/repo.git\nbase_commit: 1a2b3c4d\n"
MISSING_REPO = "workspace.yaml: missing required key 'repo' (only a task with an image environment may omit it)"
BAD_ENVIRONMENT = (
    "workspace.yaml: 'environment' must be an environment name, {image: REF} "
    "or {dockerfile: PATH, context: DIR, build_args: {...}, target: STAGE}"
)


def make_task(root: Path, files: dict[str, str | bytes], *, executable: tuple[str, ...] = ()) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        os.chmod(path, 0o755 if name in executable else 0o644)
    return root


def task_with_yaml(tmp_path, text: str | bytes) -> Path:
    return make_task(tmp_path / "task", {"workspace.yaml": text, "prompt.md": "Do it.\n"})


def yaml_error(tmp_path, text: str | bytes, **kwargs) -> str:
    with pytest.raises(TaskError) as info:
        load_task(task_with_yaml(tmp_path, text), **kwargs)
    return str(info.value)


# -- a complete task ------------------------------------------------------------------


def test_full_task(tmp_path):
    root = make_task(
        tmp_path / "task",
        {
            "workspace.yaml": (
                "repo: https://github.com/org/repo.git\n"
                "base_commit: 0123456\n"  # all digits, leading zero: kept as written
                "version: 3.10\n"  # not 3.1
                "language: python\n"
                "install:\n  - pip install -e .\n  - make deps\n"
                "static_assets:\n  corpus: {path: data/corpus}\n"
                "env:\n  DEBUG: 1\n  CI: true\n  NAME: plain\n"
            ),
            "prompt.md": "\ufeffFix the parser.\n",
            "original_pr.md": "The fix \xff".encode("latin-1"),
            "checks.txt": "# comment\n\npytest -q tests/a\r\n  ruff check .  \n#another\n",
            "tests/pass_to_pass_b.sh": "bash b\n",
            "tests/fail_to_pass_a.sh": "bash a\n",
            "tests/zz_other.sh": "echo z\n",
            "tests/test_parser.py": "def test(): pass\n",
            "tests/fixtures/sample.json": "{}",
            "tests/fixtures/run.sh": "echo nested\n",
        },
        executable=("tests/fixtures/run.sh",),
    )
    spec = load_task(root)
    assert spec.root == root
    assert spec.repo == "https://github.com/org/repo.git"
    assert spec.base_commit == "0123456"
    assert spec.version == "3.10"
    assert spec.language == "python"
    assert spec.install == ["pip install -e .", "make deps"]
    assert spec.static_assets == {"corpus": {"path": "data/corpus"}}
    assert spec.env == {"DEBUG": "1", "CI": "true", "NAME": "plain"}
    assert spec.prompt == "Fix the parser.\n"
    assert spec.original_pr == "The fix \ufffd"
    assert spec.tests == [
        TestSpec("fail_to_pass_a", "fail_to_pass", "bash a\n", None, "tests/fail_to_pass_a.sh"),
        TestSpec("pass_to_pass_b", "pass_to_pass", "bash b\n", None, "tests/pass_to_pass_b.sh"),
        TestSpec("zz_other", "test", "echo z\n", None, "tests/zz_other.sh"),
        TestSpec("check_1", "check", None, "pytest -q tests/a", "checks.txt:3"),
        TestSpec("check_2", "check", None, "ruff check .", "checks.txt:4"),
    ]
    assert spec.support_files == [
        SupportFile("fixtures/run.sh", b"echo nested\n", 0o755),
        SupportFile("fixtures/sample.json", b"{}", 0o644),
        SupportFile("test_parser.py", b"def test(): pass\n", 0o644),
    ]
    relpath, data, mode = spec.support_files[0]  # plain tuples too
    assert (relpath, mode) == ("fixtures/run.sh", 0o755)


def test_minimal_task_defaults(tmp_path):
    spec = load_task(task_with_yaml(tmp_path, GOOD_YAML))
    assert spec.base_commit == "1a2b3c4d"
    assert (spec.version, spec.language, spec.original_pr) == (None, None, None)
    assert (spec.install, spec.static_assets, spec.env, spec.tests, spec.support_files) == ([], {}, {}, [], [])


def test_optional_keys_may_be_empty(tmp_path):
    spec = load_task(task_with_yaml(tmp_path, GOOD_YAML + "install:\nenv:\nstatic_assets:\nversion:\n"))
    assert (spec.install, spec.env, spec.static_assets, spec.version) == ([], {}, {}, None)


def test_environment_names_a_root_filesystem(tmp_path):
    assert load_task(task_with_yaml(tmp_path, GOOD_YAML)).environment is None
    assert load_task(task_with_yaml(tmp_path / "2", GOOD_YAML + "environment:\n")).environment is None
    spec = load_task(task_with_yaml(tmp_path / "3", GOOD_YAML + "environment: debian-12.slim_py\n"))
    assert spec.environment == "debian-12.slim_py"  # existence is checked at preparing_environment, not here


# -- YAML safety -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tag"),
    [
        (
            "repo: !!python/object/apply:os.system ['touch /tmp/pwned']\nbase_commit: a\n",
            "!!python/object/apply:os.system",
        ),
        ("!!python/object:collections.OrderedDict {}\n", "!!python/object:collections.OrderedDict"),
        ("repo: x\nbase_commit: !!python/name:os.system\n", "!!python/name:os.system"),
        ("repo: !custom x\nbase_commit: a\n", "!custom"),
    ],
)
def test_python_and_custom_tags_are_refused(tmp_path, text, tag):
    message = yaml_error(tmp_path, text)
    assert message.startswith(f"workspace.yaml uses the YAML tag {tag} (line ")
    assert "only plain values are allowed" in message
    assert not Path("/tmp/pwned").exists()


BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
repo: https://example.com/r.git
base_commit: abc
install: *i
"""


@pytest.fixture
def node_visits(monkeypatch):
    """How many times the alias check asked a YAML node for its children; past ``limit`` it stops
    with an AssertionError, so a check that walks the expanded document fails instead of hanging."""
    from evaluations.tasks import readers

    real, visits = readers._children, {"count": 0, "limit": 2_000}

    def counting(node):
        visits["count"] += 1
        assert visits["count"] <= visits["limit"], "the alias check walks the expanded document"
        return real(node)

    monkeypatch.setattr(readers, "_children", counting)
    return visits


def test_billion_laughs_is_refused_quickly(tmp_path, node_visits):
    # 9**9 values expanded, about 40 distinct nodes in the file: each is visited
    # (asked for its children) twice, whatever the aliases expand to.
    assert "expands to more than 100000 values" in yaml_error(tmp_path, BILLION_LAUGHS)
    assert node_visits["count"] <= 100


def test_merge_key_bomb_is_refused(tmp_path, node_visits):
    lines = ["l0: &l0 {k0: v}"]
    for n in range(1, 30):
        lines.append(f"l{n}: &l{n} {{<<: [*l{n - 1}, *l{n - 1}], k{n}: v}}")
    text = "\n".join(lines) + "\nrepo: https://example.com/r.git\nbase_commit: abc\n"
    assert "expands to more than" in yaml_error(tmp_path, text)
    # Six distinct nodes a line (30 lines, 2**29 values expanded), each visited twice.
    assert node_visits["count"] <= 400


def test_modest_alias_use_is_fine(tmp_path):
    text = GOOD_YAML + "x-common: &cmd pip install -e .\ninstall: [*cmd, *cmd]\n"
    assert load_task(task_with_yaml(tmp_path, text)).install == ["pip install -e .", "pip install -e ."]


def test_recursive_alias_is_refused(tmp_path):
    assert "recursive alias" in yaml_error(tmp_path, GOOD_YAML + "loop: &x [1, *x]\n")


def test_deep_nesting_is_refused(tmp_path):
    assert yaml_error(tmp_path, GOOD_YAML + "deep: " + "[" * 20000 + "]" * 20000 + "\n") == (
        "workspace.yaml is nested too deeply"
    )


def test_oversized_yaml_is_refused(tmp_path):
    text = GOOD_YAML + "# " + "x" * MAX_YAML_BYTES + "\n"
    assert yaml_error(tmp_path, text) == f"workspace.yaml is larger than {MAX_YAML_BYTES} bytes"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "workspace.yaml must be a mapping of keys to values, not a list"),
        ("just text\n", "workspace.yaml must be a mapping of keys to values, not a string"),
        ("", "workspace.yaml is empty; it must be a mapping of keys to values"),
        ("# only a comment\n", "workspace.yaml is empty; it must be a mapping of keys to values"),
    ],
)
def test_non_mapping_is_refused(tmp_path, text, message):
    assert yaml_error(tmp_path, text) == message


def test_invalid_yaml_names_the_line(tmp_path):
    assert yaml_error(tmp_path, "repo: x\nbase_commit: [unclosed\n").startswith(
        "workspace.yaml is not valid YAML (line "
    )
    assert "not valid YAML" in yaml_error(tmp_path, "a: 1\n---\nb: 2\n")  # two documents
    assert yaml_error(tmp_path, b"repo: \xff\xfe\x00bad") == "workspace.yaml is not valid UTF-8 text"


# -- keys ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("base_commit: abc\n", MISSING_REPO),
        ("repo:\nbase_commit: abc\n", MISSING_REPO),
        ("repo: https://example.com/r.git\n", "workspace.yaml: missing required key 'base_commit'"),
        ("repo: 42\nbase_commit: abc\n", "workspace.yaml: 'repo' must be a string (a git URL)"),
        ("repo: [a]\nbase_commit: abc\n", "workspace.yaml: 'repo' must be a string (a git URL)"),
        (GOOD_YAML.replace("1a2b3c4d", "[a]"), "workspace.yaml: 'base_commit' must be a string (a commit id or ref)"),
        (GOOD_YAML.replace("1a2b3c4d", "''"), "workspace.yaml: 'base_commit' must not be empty"),
        (GOOD_YAML.replace("1a2b3c4d", "--upload-pack=evil"), "workspace.yaml: 'base_commit' must not start with '-'"),
        (
            GOOD_YAML.replace("1a2b3c4d", "'abc def'"),
            "workspace.yaml: 'base_commit' must not contain whitespace or control characters",
        ),
        (
            GOOD_YAML.replace("1a2b3c4d", '"abc\\x01"'),
            "workspace.yaml: 'base_commit' must not contain whitespace or control characters",
        ),
        (GOOD_YAML + "version: [1]\n", "workspace.yaml: 'version' must be a string or a number"),
        (GOOD_YAML + "version: true\n", "workspace.yaml: 'version' must be a string or a number"),
        (GOOD_YAML + "language: 3\n", "workspace.yaml: 'language' must be a string"),
        (GOOD_YAML + "install: pip install .\n", "workspace.yaml: 'install' must be a list of strings"),
        (GOOD_YAML + "install: [make, 3]\n", "workspace.yaml: 'install' must be a list of strings"),
        (GOOD_YAML + "install: {a: b}\n", "workspace.yaml: 'install' must be a list of strings"),
        (GOOD_YAML + "static_assets: [a]\n", "workspace.yaml: 'static_assets' must be a mapping of names to assets"),
        (GOOD_YAML + "env: [A]\n", "workspace.yaml: 'env' must be a mapping of variable names to strings"),
        (
            GOOD_YAML + "env: {lower: x}\n",
            "workspace.yaml: 'env' name 'lower' is not a valid variable name ([A-Z_][A-Z0-9_]*)",
        ),
        (
            GOOD_YAML + "env: {1A: x}\n",
            "workspace.yaml: 'env' name '1A' is not a valid variable name ([A-Z_][A-Z0-9_]*)",
        ),
        (GOOD_YAML + "env: {A: [x]}\n", "workspace.yaml: 'env' value of A must be a string"),
        (GOOD_YAML + "env: {A: }\n", "workspace.yaml: 'env' value of A must be a string"),
        (GOOD_YAML + 'env: {A: "x\\0y"}\n', "workspace.yaml: 'env' value of A contains a NUL byte"),
        (GOOD_YAML + "environment: 12\n", BAD_ENVIRONMENT),
        (GOOD_YAML + "environment: [a]\n", BAD_ENVIRONMENT),
        (GOOD_YAML + "environment: ''\n", "workspace.yaml: 'environment': an environment name must not be empty"),
        (
            GOOD_YAML + "environment: a/b\n",
            "workspace.yaml: 'environment': environment name 'a/b' must not contain '/'",
        ),
        (GOOD_YAML + "environment: ..\n", "workspace.yaml: 'environment': environment name '..' must not contain '..'"),
        (
            GOOD_YAML + "environment: Debian\n",
            "workspace.yaml: 'environment': environment name 'Debian' is not valid: lowercase letters, digits, "
            "'.', '_' and '-', starting with a letter or a digit",
        ),
    ],
)
def test_missing_and_wrong_typed_keys_are_named(tmp_path, text, message):
    assert yaml_error(tmp_path, text) == message


@pytest.mark.parametrize(
    ("repo", "fragment"),
    [
        ("'ext::sh -c x'", "workspace.yaml: 'repo' uses the git transport helper 'ext::'"),
        ("-oProxyCommand=evil", "workspace.yaml: 'repo' must not start with '-'"),
        ("ssh://git@example.com/r.git", "workspace.yaml: 'repo' scheme 'ssh' is not allowed (allowed: http, https)"),
        ("git@github.com:org/r.git", "workspace.yaml: 'repo' is not an absolute URL (allowed schemes: http, https)"),
        ("file:///srv/r.git", "workspace.yaml: 'repo' scheme 'file' is not allowed"),
    ],
)
def test_unsafe_repo_urls_are_refused(tmp_path, repo, fragment):
    assert yaml_error(tmp_path, f"repo: {repo}\nbase_commit: abc\n").startswith(fragment)


def test_file_repo_when_allowed(tmp_path):
    root = task_with_yaml(tmp_path, "repo: file:///srv/r.git\nbase_commit: abc\n")
    assert load_task(root, allow_file_urls=True).repo == "file:///srv/r.git"


def test_repo_host_is_not_resolved_at_load_time(tmp_path):
    # Address checks happen at clone time; loading works offline.
    root = task_with_yaml(tmp_path, "repo: https://127.0.0.1/r.git\nbase_commit: abc\n")
    assert load_task(root).repo == "https://127.0.0.1/r.git"


# -- other files ------------------------------------------------------------------------


def test_missing_workspace_and_prompt_are_named(tmp_path):
    with pytest.raises(
        TaskError,
        match=r"^task has no task.toml \(Harbor\), task.yaml \(Terminal-Bench\) or workspace.yaml at its root$",
    ):
        load_task(make_task(tmp_path / "a", {"prompt.md": "x"}))
    with pytest.raises(TaskError, match=r"^task has no prompt.md \(required unless workspace.yaml has 'prompt'\)$"):
        load_task(make_task(tmp_path / "b", {"workspace.yaml": GOOD_YAML}))


def test_prompt_must_be_utf8(tmp_path):
    root = make_task(tmp_path / "t", {"workspace.yaml": GOOD_YAML, "prompt.md": b"caf\xe9"})
    with pytest.raises(TaskError, match="^prompt.md is not valid UTF-8 text$"):
        load_task(root)


def test_checks_must_be_utf8(tmp_path):
    root = make_task(tmp_path / "t", {"workspace.yaml": GOOD_YAML, "prompt.md": "p", "checks.txt": b"\xff\n"})
    with pytest.raises(TaskError, match="^checks.txt is not valid UTF-8 text$"):
        load_task(root)


def test_test_script_must_be_utf8(tmp_path):
    root = make_task(tmp_path / "t", {"workspace.yaml": GOOD_YAML, "prompt.md": "p", "tests/a.sh": b"\xff"})
    with pytest.raises(TaskError, match="^tests/a.sh is not valid UTF-8 text$"):
        load_task(root)


def test_script_name_clashing_with_a_check_is_refused(tmp_path):
    files = {"workspace.yaml": GOOD_YAML, "prompt.md": "p", "tests/check_1.sh": "x", "checks.txt": "true\n"}
    with pytest.raises(TaskError, match="tests/check_1.sh has the same test name as the command at checks.txt:1"):
        load_task(make_task(tmp_path / "t", files))


def test_symlink_under_tests_is_refused(tmp_path):
    root = make_task(tmp_path / "t", {"workspace.yaml": GOOD_YAML, "prompt.md": "p", "tests/a.sh": "x"})
    (root / "tests/leak.txt").symlink_to("/etc/passwd")
    with pytest.raises(TaskError, match="tests/leak.txt is a symbolic link"):
        load_task(root)


def test_tests_must_be_a_folder(tmp_path):
    root = make_task(tmp_path / "t", {"workspace.yaml": GOOD_YAML, "prompt.md": "p", "tests": "not a folder"})
    with pytest.raises(TaskError, match="tests is not a folder"):
        load_task(root)


# -- caps on what a task brings (MAX_PROMPT_BYTES, MAX_TESTS) -----------------------------------


def _peak_bytes(call) -> int:
    tracemalloc.start()
    try:
        call()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_a_200_mb_original_pr_is_refused_from_its_size_without_being_read(tmp_path):
    root = make_task(tmp_path / "t", {"workspace.yaml": GOOD_YAML, "prompt.md": "p"})
    with open(root / "original_pr.md", "wb") as f:  # sparse: 200 MB on paper, no disk
        f.truncate(200 * 1024 * 1024)

    def load():
        with pytest.raises(TaskError, match=r"^original_pr.md is larger than 262144 bytes \(MAX_PROMPT_BYTES\)$"):
            load_task(root)

    assert _peak_bytes(load) < 1024 * 1024


def test_each_text_is_kept_at_its_cap_and_refused_past_it(tmp_path):
    files = {"workspace.yaml": GOOD_YAML, "prompt.md": "p" * 100, "original_pr.md": "o" * 100}
    spec = load_task(make_task(tmp_path / "a", files), max_prompt_bytes=100)
    assert (spec.prompt, spec.original_pr) == ("p" * 100, "o" * 100)
    for name in ("prompt.md", "original_pr.md"):
        root = make_task(tmp_path / name, {**files, name: "x" * 101})
        with pytest.raises(TaskError, match=rf"^{name} is larger than 100 bytes \(MAX_PROMPT_BYTES\)$"):
            load_task(root, max_prompt_bytes=100)


def test_original_pr_with_invalid_utf8_is_held_to_the_cap_as_it_would_be_stored(tmp_path):
    files = {"workspace.yaml": GOOD_YAML, "prompt.md": "p", "original_pr.md": b"\xff" * 33}
    assert load_task(make_task(tmp_path / "a", files), max_prompt_bytes=99).original_pr == "\ufffd" * 33
    with pytest.raises(TaskError) as info:
        load_task(make_task(tmp_path / "b", {**files, "original_pr.md": b"\xff" * 34}), max_prompt_bytes=99)
    assert str(info.value) == (
        "original_pr.md is larger than 99 bytes once its invalid UTF-8 is replaced (MAX_PROMPT_BYTES)"
    )


def test_prompt_md_is_held_to_what_one_argument_holds_whatever_max_prompt_bytes_says(tmp_path):
    files = {"workspace.yaml": GOOD_YAML, "prompt.md": "p" * (128 * 1024 - 1)}
    assert len(load_task(make_task(tmp_path / "a", files)).prompt) == 128 * 1024 - 1
    root = make_task(tmp_path / "b", {**files, "prompt.md": "p" * 128 * 1024})
    with pytest.raises(TaskError) as info:
        load_task(root, max_prompt_bytes=10**6)
    assert str(info.value) == (
        "prompt.md is larger than 131071 bytes (the most an agent's --instruction argument holds; "
        "MAX_PROMPT_BYTES is 1000000)"
    )


def test_300000_checks_are_refused_at_the_first_past_the_cap_reading_no_further(tmp_path):
    root = make_task(tmp_path / "t", {"workspace.yaml": GOOD_YAML, "prompt.md": "p", "tests/a.sh": "true\n"})
    (root / "checks.txt").write_text("\n# blank lines and comments do not count\n" + "true\n" * 300_000)

    def load():
        with pytest.raises(TaskError) as info:
            load_task(root)
        assert str(info.value) == (
            "checks.txt line 1002 is test 1001, over the cap of 1000 tests "
            "(MAX_TESTS: tests/*.sh scripts and checks.txt commands together)"
        )

    assert _peak_bytes(load) < 2 * 1024 * 1024  # not 300,000 TestSpecs


def test_max_tests_counts_scripts_and_checks_together(tmp_path):
    files = {"workspace.yaml": GOOD_YAML, "prompt.md": "p", "tests/a.sh": "x", "tests/b.sh": "x"}
    spec = load_task(make_task(tmp_path / "a", {**files, "checks.txt": "true\ntrue\n"}), max_tests=4)
    assert [t.name for t in spec.tests] == ["a", "b", "check_1", "check_2"]
    with pytest.raises(TaskError, match="^checks.txt line 3 is test 5, over the cap of 4 tests"):
        load_task(make_task(tmp_path / "b", {**files, "checks.txt": "true\ntrue\ntrue\n"}), max_tests=4)
    with pytest.raises(TaskError, match="^tests/b.sh is test 2, over the cap of 1 tests"):
        load_task(make_task(tmp_path / "c", files), max_tests=1)


# -- image environments (SPEC §16) ----------------------------------------------------------


def test_an_image_environment_may_stand_without_a_repository(tmp_path):
    spec = load_task(task_with_yaml(tmp_path, "environment:\n  image: python:3.12-slim\n"))
    assert spec.environment == ImageEnvironment(image="python:3.12-slim")
    assert (spec.repo, spec.base_commit, spec.environment.kind) == (None, None, "image")
    with_repo = load_task(
        task_with_yaml(tmp_path / "b", GOOD_YAML + "environment: {image: 'ghcr.io/o/n@sha256:" + "a" * 64 + "'}\n")
    )
    assert with_repo.repo == "https://github.com/org/repo.git" and with_repo.environment.kind == "image"


def test_a_dockerfile_environment_reads_its_paths_inside_the_task(tmp_path):
    root = make_task(
        tmp_path / "task",
        {
            "workspace.yaml": "environment:\n  dockerfile: environment/Dockerfile\n  build_args: {V: 3, NAME: x}\n"
            "  target: final\n",
            "prompt.md": "Do it.\n",
            "environment/Dockerfile": "FROM scratch\n",
        },
    )
    spec = load_task(root)
    assert spec.environment == ImageEnvironment(
        dockerfile="environment/Dockerfile", context="environment", build_args={"V": "3", "NAME": "x"}, target="final"
    )
    assert spec.environment.kind == "dockerfile" and spec.environment.ref == "environment/Dockerfile"


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ("{image: a, dockerfile: b}", "give exactly one of 'image' (a reference) and 'dockerfile' (a path)"),
        ("{}", "give exactly one of 'image' (a reference) and 'dockerfile' (a path)"),
        ("{image: a, registry: b}", "unknown key 'registry' (allowed: build_args, context, dockerfile, image, target)"),
        ("{image: a, target: b}", "'target' goes with 'dockerfile', not with 'image'"),
        ("{image: ''}", "'image' must be an image reference such as python:3.12-slim"),
        ("{image: 'a b'}", "'image' 'a b' is not an image reference"),
        ("{image: 12}", "'image' must be an image reference such as python:3.12-slim"),
        ("{image: 'Python:3'}", "The image reference 'Python:3' must be lower case in its repository name."),
        (
            "{dockerfile: ../Dockerfile}",
            "'dockerfile' '../Dockerfile' must be a relative path inside the task, without '..'",
        ),
        (
            "{dockerfile: /etc/passwd}",
            "'dockerfile' '/etc/passwd' must be a relative path inside the task, without '..'",
        ),
        ("{dockerfile: missing}", "'dockerfile' 'missing' is not a file of the task"),
        ("{dockerfile: Dockerfile, context: nowhere}", "'context' 'nowhere' is not a folder of the task"),
        ("{dockerfile: Dockerfile, build_args: [a]}", "'build_args' must be a mapping of names to values"),
        ("{dockerfile: Dockerfile, build_args: {A: [1]}}", "build arg 'A' must be a string or a number, got a list"),
        ("{dockerfile: Dockerfile, target: ''}", "'target' must be a stage name"),
        ("{dockerfile: escape}", "'dockerfile' 'escape' leads outside the task (a symbolic link)"),
    ],
)
def test_bad_image_environments_are_named(tmp_path, environment, message):
    root = task_with_yaml(tmp_path, f"environment: {environment}\n")
    (root / "Dockerfile").write_text("FROM scratch\n")
    os.symlink("/etc/hostname", root / "escape")
    with pytest.raises(TaskError) as info:
        load_task(root)
    assert str(info.value) == f"workspace.yaml: 'environment': {message}"


def test_a_base_commit_needs_a_repository(tmp_path):
    error = yaml_error(tmp_path, "base_commit: abc\nenvironment: {image: alpine}\n")
    assert error == "workspace.yaml: 'base_commit' without 'repo': a base commit needs a repository"
