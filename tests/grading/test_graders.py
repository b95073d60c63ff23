"""Graders (SPEC §17): reward files a verifier wrote, and pytest's -rA output, each good and bad input."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from evaluations.grading.parsers.pytest_summary import PytestGrade, grade_pytest
from evaluations.grading.reward_file import MAX_REWARD_BYTES, GradeError, Reward, read_reward
from evaluations.safefs import SafeFSError, unix_address

J = "/logs/verifier/reward.json"
T = "/logs/verifier/reward.txt"


@pytest.fixture
def folder(tmp_path):
    verifier = tmp_path / "verifier"
    verifier.mkdir()
    return verifier


def refused(folder) -> str:
    with pytest.raises(GradeError) as info:
        read_reward(folder)
    assert info.value.message == str(info.value)
    return info.value.message


# -- read_reward: good files -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, reward, rewards",
    [
        ('{"reward": 0.5}', 0.5, {"reward": 0.5}),
        ('{"reward": 1, "style": 0.25, "speed": -2}', 1.0, {"reward": 1.0, "style": 0.25, "speed": -2.0}),
        ('{"accuracy": 0.75}', 0.75, {"accuracy": 0.75}),  # the only key is the headline
        ('\n  {"reward": 1e2}\n', 100.0, {"reward": 100.0}),
        ('{"reward": 0, "": 1}', 0.0, {"reward": 0.0, "": 1.0}),
    ],
)
def test_reward_json(folder, text, reward, rewards):
    (folder / "reward.json").write_text(text)
    got = read_reward(folder)
    assert got == Reward(reward, rewards, "reward.json")
    assert all(type(v) is float for v in got.rewards.values())


@pytest.mark.parametrize(
    "text, reward", [("1", 1.0), ("0.25\n", 0.25), ("  \t-1e-3 \r\n", -0.001), ("+.5", 0.5), ("7.", 7.0)]
)
def test_reward_txt(folder, text, reward):
    (folder / "reward.txt").write_text(text)
    assert read_reward(folder) == Reward(reward, {"reward": reward}, "reward.txt")


def test_reward_json_wins_over_reward_txt(folder):
    (folder / "reward.json").write_text('{"reward": 0.0}')
    (folder / "reward.txt").write_text("1")
    assert read_reward(folder) == Reward(0.0, {"reward": 0.0}, "reward.json")


def test_a_file_of_exactly_the_cap_is_read(folder):
    body = '{"reward": 1}'
    (folder / "reward.json").write_text(body + " " * (MAX_REWARD_BYTES - len(body)))
    assert read_reward(folder).reward == 1.0


# -- read_reward: bad files, each with its sentence --------------------------------------------


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", f"{J} is empty"),
        (b" \n\t", f"{J} is empty"),
        (b'{"reward": "\xff"}', f"{J} is not UTF-8 text"),
        (b"\xef\xbb\xbf{}", f"{J} is not valid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig) (line 1, column 1)"),
        (b"{", f"{J} is not valid JSON: Expecting property name enclosed in double quotes (line 1, column 2)"),
        (b'{"reward": 1} x', f"{J} is not valid JSON: Extra data (line 1, column 15)"),
        (b"[1]", f'{J} holds an array, not an object of numbers such as {{"reward": 1.0}}'),
        (b"1", f'{J} holds a number, not an object of numbers such as {{"reward": 1.0}}'),
        (b"null", f'{J} holds null, not an object of numbers such as {{"reward": 1.0}}'),
        (b'"1"', f'{J} holds a string, not an object of numbers such as {{"reward": 1.0}}'),
        (b"{}", f"{J} holds an empty object: it names no reward"),
        (b'{"reward": true}', f'{J}: the value of "reward" is true, not a number'),
        (b'{"reward": false}', f'{J}: the value of "reward" is false, not a number'),
        (b'{"reward": "1.0"}', f'{J}: the value of "reward" is a string, not a number'),
        (b'{"reward": null}', f'{J}: the value of "reward" is null, not a number'),
        (b'{"reward": {"x": 1}}', f'{J}: the value of "reward" is an object, not a number'),
        (b'{"reward": [1]}', f'{J}: the value of "reward" is an array, not a number'),
        (b'{"reward": 1, "style": "good"}', f'{J}: the value of "style" is a string, not a number'),
        (b'{"reward": NaN}', f'{J}: the value of "reward" is not a finite number (nan)'),
        (b'{"reward": Infinity}', f'{J}: the value of "reward" is not a finite number (inf)'),
        (b'{"reward": 1, "x": -Infinity}', f'{J}: the value of "x" is not a finite number (-inf)'),
        (b'{"reward": 1e999}', f'{J}: the value of "reward" is not a finite number (inf)'),
        (b'{"reward": 1' + b"0" * 400 + b"}", f'{J}: the value of "reward" is not a finite number (1{"0" * 400})'),
        (b'{"reward": 1, "reward": 0}', f'{J} has the key "reward" twice'),
        (b'{"a": {"b": 1, "b": 2}}', f'{J} has the key "b" twice'),
        (
            b'{"a": 1, "b": 0}',
            f'{J} has several keys ("a", "b") and none is "reward": which one is the reward is unclear',
        ),
    ],
)
def test_bad_reward_json(folder, data, message):
    (folder / "reward.json").write_bytes(data)
    (folder / "reward.txt").write_text("1")  # never a fallback once reward.json exists
    assert refused(folder) == message


def test_an_integer_too_long_for_python_is_invalid_json(folder):
    (folder / "reward.json").write_text('{"reward": ' + "9" * 5000 + "}")
    assert refused(folder).startswith(f"{J} is not valid JSON: Exceeds the limit (4300 digits)")


def test_several_keys_are_named_five_at_most(folder):
    (folder / "reward.json").write_text(json.dumps({k: 1 for k in "abcdefg"}))
    assert refused(folder) == (
        f'{J} has several keys ("a", "b", "c", "d", "e", ...) and none is "reward": which one is the reward is unclear'
    )


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", f"{T} is empty"),
        (b"\n \n", f"{T} is empty"),
        (b"\xff\xfe1", f"{T} is not UTF-8 text"),
        (b"abc", f'{T} holds "abc", not one number'),
        (b"1 2", f'{T} holds "1 2", not one number'),
        (b"1\n0\n", f'{T} holds "1\\n0", not one number'),
        (b"true", f'{T} holds "true", not one number'),
        (b"1_000", f'{T} holds "1_000", not one number'),
        (b"0x1", f'{T} holds "0x1", not one number'),
        ("\u0661".encode(), f'{T} holds "\u0661", not one number'),  # an Arabic-Indic 1: float() takes it
        (b'{"reward": 1}', f'{T} holds "{{\\"reward\\": 1}}", not one number'),
        (b"x" * 100, f'{T} holds "{"x" * 40}...", not one number'),
        (b"nan", f'{T} holds "nan", not a finite number'),
        (b"inf", f'{T} holds "inf", not a finite number'),
        (b"-Infinity\n", f'{T} holds "-Infinity", not a finite number'),
        (b"1e999", f'{T} holds "1e999", not a finite number'),
    ],
)
def test_bad_reward_txt(folder, data, message):
    (folder / "reward.txt").write_bytes(data)
    assert refused(folder) == message


def test_no_reward_file(folder):
    (folder / "reward").write_text("1")
    (folder / "test-stdout.txt").write_text("ok")
    assert refused(folder) == f"the verifier wrote no reward: neither {J} nor {T} exists"


def test_the_name_shown_is_the_callers(folder):
    with pytest.raises(GradeError) as info:
        read_reward(folder, shown="/x/y")
    assert info.value.message == "the verifier wrote no reward: neither /x/y/reward.json nor /x/y/reward.txt exists"


# -- read_reward: what untrusted code can leave at the name ------------------------------------


@pytest.mark.parametrize("name", ["reward.json", "reward.txt"])
def test_a_link_is_refused_not_followed(folder, tmp_path, name):
    target = tmp_path / "elsewhere"
    target.write_text('{"reward": 1}' if name == "reward.json" else "1")
    (folder / name).symlink_to(target)
    shown = J if name == "reward.json" else T
    assert refused(folder) == f"{shown} is a symbolic link, not a file"


def test_a_dangling_link_at_reward_json_is_refused_not_skipped(folder):
    (folder / "reward.json").symlink_to("/nonexistent/reward.json")
    (folder / "reward.txt").write_text("1")
    assert refused(folder) == f"{J} is a symbolic link, not a file"


def test_a_folder_at_the_name_is_refused(folder):
    (folder / "reward.json").mkdir()
    assert refused(folder) == f"{J} is a folder, not a file"


def test_a_fifo_is_refused_without_blocking(folder):
    os.mkfifo(folder / "reward.txt")  # no writer: a blocking open would wait forever
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(refused(folder)), daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert not reader.is_alive(), "read_reward blocked on a FIFO"
    assert outcome == [f"{T} is a FIFO, not a file"]


def test_a_socket_is_refused(folder):
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(unix_address(dir_fd, "reward.json"))
        assert refused(folder) == f"{J} is a socket, not a file"
    os.close(dir_fd)


def test_a_file_over_the_cap_is_refused(folder):
    (folder / "reward.json").write_text('{"reward": 1}' + " " * MAX_REWARD_BYTES)
    size = MAX_REWARD_BYTES + len('{"reward": 1}')
    assert refused(folder) == f"{J} is {size} bytes, over the cap of {MAX_REWARD_BYTES} bytes"


def test_a_huge_file_is_refused_from_its_size_unread(folder):
    with open(folder / "reward.txt", "wb") as f:
        f.truncate(1 << 40)  # sparse: 1 TiB nobody could read in a test's time
    assert refused(folder) == f"{T} is {1 << 40} bytes, over the cap of {MAX_REWARD_BYTES} bytes"


def test_a_folder_that_cannot_be_opened_is_the_executors_error(tmp_path):
    with pytest.raises(SafeFSError):
        read_reward(tmp_path / "missing")
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "reward.txt").write_text("1")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(SafeFSError):
        read_reward(tmp_path / "link")


# -- grade_pytest on real pytest runs ----------------------------------------------------------


def run_pytest(folder, files: dict[str, str], *args: str) -> tuple[str, int]:
    """Run this venv's pytest on ``files`` written in ``folder``; its merged output and exit status."""
    folder.mkdir(exist_ok=True)
    (folder / "pytest.ini").write_text("[pytest]\n")  # not the project's pytest.ini and its options
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONDONTWRITEBYTECODE": "1",
        "LC_ALL": "C.UTF-8",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # plain pytest, as a task's image has it
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, *files],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    return done.stdout, done.returncode


MIXED = """
    import pytest

    def test_ok():
        pass

    def test_bad():
        assert 1 == 2, "boom - with a dash"

    @pytest.mark.parametrize("x", ["a b", "c]d - e", "[x"])
    def test_p(x):
        assert x != "[x"

    class TestK:
        def test_m(self):
            pass
"""
MIXED_RESULTS = [
    ("test_mixed.py::test_ok", True),
    ("test_mixed.py::test_p[a b]", True),
    ("test_mixed.py::test_p[c]d - e]", True),
    ("test_mixed.py::TestK::test_m", True),
    ("test_mixed.py::test_bad", False),
    ("test_mixed.py::test_p[[x]", False),
]
MIXED_REASON = "2 of 6 tests failed (test_mixed.py::test_bad, test_mixed.py::test_p[[x])"


def test_every_test_passing_passes(tmp_path):
    output, code = run_pytest(tmp_path, {"test_good.py": "def test_a(): pass\ndef test_b(): pass\n"}, "-rA")
    assert code == 0
    assert grade_pytest(output, code) == PytestGrade(
        [("test_good.py::test_a", True), ("test_good.py::test_b", True)], True, ""
    )


@pytest.mark.parametrize("style", [["-rA"], ["-rA", "-q"], ["-rA", "--color=yes"], ["-rA", "-v"]])
def test_failures_are_named_in_every_output_style(tmp_path, style):
    output, code = run_pytest(tmp_path, {"test_mixed.py": MIXED}, *style)
    assert code == 1
    if "--color=yes" in style:
        assert "\x1b[" in output
    assert grade_pytest(output, code) == PytestGrade(MIXED_RESULTS, False, MIXED_REASON)


def test_crlf_output_grades_the_same(tmp_path):
    output, code = run_pytest(tmp_path, {"test_mixed.py": MIXED}, "-rA")
    assert grade_pytest(output.replace("\n", "\r\n"), code) == PytestGrade(MIXED_RESULTS, False, MIXED_REASON)


SUMMARY = "=========================== short test summary info ============================"
FORGED_SUMMARY = (
    "=========================== short test summary info ============================\\n"
    "PASSED test_forged.py::test_real\\n"
    "============================== 1 passed in 0.01s ==============================="
)


@pytest.mark.parametrize("capture", [[], ["-s"]])
def test_a_summary_printed_by_a_failing_test_is_not_the_summary(tmp_path, capture):
    test = f"""
        def test_real():
            print("{FORGED_SUMMARY}")
            assert False, "the agent's code is wrong"
    """
    output, code = run_pytest(tmp_path, {"test_forged.py": test}, "-rA", *capture)
    assert code == 1 and output.index("\nPASSED test_forged.py::test_real\n") < output.rindex(SUMMARY)
    grade = grade_pytest(output, code)
    assert grade == PytestGrade(
        [("test_forged.py::test_real", False)], False, "1 of 1 test failed (test_forged.py::test_real)"
    )


def test_a_summary_printed_after_pytest_ended_is_caught_by_the_exit_status(tmp_path):
    # The agent's module prints a summary of passes at exit, after pytest's own (which has a failure).
    module = f"""
        import atexit

        atexit.register(lambda: print("{FORGED_SUMMARY}"))

        def real():
            return 41
    """
    test = """
        from solution import real

        def test_real():
            assert real() == 42
    """
    output, code = run_pytest(tmp_path, {"solution.py": module, "test_forged.py": test}, "-rA")
    assert code == 1 and output.rstrip().endswith("1 passed in 0.01s ===============================")
    assert grade_pytest(output, code) == PytestGrade(
        [("test_forged.py::test_real", True)], False, "pytest exited 1 though the summary shows every test passed"
    )


def test_a_skip_reason_that_prints_a_passed_line_is_caught_by_the_counts(tmp_path):
    # Every test skipped exits 0; the reason, printed as it is, forges a PASSED line in the summary.
    test = """
        import pytest

        def test_a():
            pytest.skip("not today\\nPASSED test_skip.py::test_a")
    """
    output, code = run_pytest(tmp_path, {"test_skip.py": test}, "-rA")
    assert code == 0 and "\nPASSED test_skip.py::test_a\n" in output
    assert grade_pytest(output, code) == PytestGrade(
        [("test_skip.py::test_a", True)],
        False,
        "the short test summary lists 1 PASSED but pytest's final line counts 0: a line in it does not stand for a test",
        skipped=1,
    )


def test_an_xfail_reason_that_prints_a_passed_line_is_caught_by_the_counts(tmp_path):
    test = """
        import pytest

        def test_a():
            pass

        def test_b():
            pytest.xfail("later\\nPASSED test_x.py::test_c")
    """
    output, code = run_pytest(tmp_path, {"test_x.py": test}, "-rA")
    assert code == 0
    grade = grade_pytest(output, code)
    assert not grade.passed
    assert grade.reason == (
        "the short test summary lists 2 PASSED but pytest's final line counts 1: a line in it does not stand for a test"
    )


def test_a_test_passing_then_erroring_in_teardown_is_one_failed_result(tmp_path):
    test = """
        import pytest

        @pytest.fixture
        def broken():
            yield
            raise RuntimeError("teardown")

        def test_td(broken):
            pass

        def test_fine():
            pass
    """
    output, code = run_pytest(tmp_path, {"test_td.py": test}, "-rA")
    assert "PASSED test_td.py::test_td" in output and "ERROR test_td.py::test_td - RuntimeError" in output
    assert grade_pytest(output, code) == PytestGrade(
        [("test_td.py::test_td", False), ("test_td.py::test_fine", True)],
        False,
        "1 of 2 tests failed (test_td.py::test_td)",
    )


def test_xfail_passes_xpass_fails_skips_are_not_results(tmp_path):
    test = """
        import pytest

        def test_ok():
            pass

        @pytest.mark.xfail(reason="known - bug")
        def test_xf():
            assert 0

        @pytest.mark.skip(reason="not here")
        def test_sk():
            pass

        @pytest.mark.skipif(True, reason="nor here")
        def test_sk2():
            pass
    """
    output, code = run_pytest(tmp_path, {"test_st.py": test}, "-rA")
    assert code == 0
    assert grade_pytest(output, code) == PytestGrade(
        [("test_st.py::test_ok", True), ("test_st.py::test_xf", True)], True, "", skipped=2
    )
    xpass = """
        import pytest

        def test_ok():
            pass

        @pytest.mark.xfail(reason="known")
        def test_xf():
            assert 0

        @pytest.mark.xfail
        def test_xp():
            pass
    """
    output, code = run_pytest(tmp_path, {"test_st.py": xpass}, "-rA")
    assert code == 0  # pytest itself does not fail on a non-strict XPASS
    assert grade_pytest(output, code).reason == "1 of 3 tests failed (test_st.py::test_xp)"


def test_a_collection_error_is_a_failed_result(tmp_path):
    output, code = run_pytest(tmp_path, {"test_broken.py": "import no_such_module\n"}, "-rA")
    assert code == 2
    assert grade_pytest(output, code) == PytestGrade(
        [("test_broken.py", False)], False, "1 of 1 test failed (test_broken.py)"
    )


def test_no_test_ran(tmp_path):
    output, code = run_pytest(tmp_path, {"test_empty.py": "X = 1\n"}, "-rA")
    assert code == 5
    assert grade_pytest(output, code) == PytestGrade(
        [], False, "no test ran: the output holds no pytest short test summary (pytest -rA prints it)"
    )
    skips = "import pytest\n\n@pytest.mark.skip\ndef test_a(): pass\n\n@pytest.mark.skip\ndef test_b(): pass\n"
    output, code = run_pytest(tmp_path, {"test_empty.py": skips}, "-rA")
    assert code == 0
    assert grade_pytest(output, code) == PytestGrade([], False, "no test ran (2 skipped)", skipped=2)


def test_without_rA_no_test_counts(tmp_path):
    output, code = run_pytest(tmp_path, {"test_good.py": "def test_a(): pass\n"})
    assert code == 0
    assert grade_pytest(output, code).reason == (
        "no test ran: the output holds no pytest short test summary (pytest -rA prints it)"
    )


def test_without_rA_passes_are_not_listed_and_do_not_count(tmp_path):
    test = "import pytest\n\ndef test_a(): pass\n\ndef test_b(): pytest.skip('no')\n"
    output, code = run_pytest(tmp_path, {"test_ra.py": test}, "-ra")
    assert code == 0 and SUMMARY in output
    assert grade_pytest(output, code) == PytestGrade(
        [],
        False,
        "the short test summary lists 0 PASSED but pytest's final line counts 1: run pytest with -rA to list every test",
        skipped=1,
    )


def test_a_killed_run_does_not_pass(tmp_path):
    output, _ = run_pytest(tmp_path, {"test_good.py": "def test_a(): pass\n"}, "-rA")
    assert grade_pytest(output, None) == PytestGrade(
        [("test_good.py::test_a", True)],
        False,
        "pytest was killed before it exited, though the summary shows every test passed",
    )


# -- grade_pytest on hand-written output -------------------------------------------------------


def summary(*lines: str, counts: str = "") -> str:
    return "\n".join(["collected 3 items", "", SUMMARY, *lines, counts])


def test_names_end_at_the_message_brackets_and_dashes_kept():
    output = summary(
        "PASSED t.py::test_a[x - y]",
        "FAILED t.py::test_b[p - q] - AssertionError: a ] - b",
        "FAILED t.py::test_c - ValueError: [ - ]",
        "ERROR t.py::TestK::test_d[[] - boom",
        "XFAIL t.py::test_e[a b] - reason - more",
        counts="=== 3 failed, 1 passed, 1 xfailed in 1.00s ===",
    )
    grade = grade_pytest(output, 1)
    assert grade.results == [
        ("t.py::test_a[x - y]", True),
        ("t.py::test_b[p - q]", False),
        ("t.py::test_c", False),
        ("t.py::TestK::test_d[[]", False),
        ("t.py::test_e[a b]", True),
    ]
    assert grade.reason == "3 of 5 tests failed (t.py::test_b[p - q], t.py::test_c, t.py::TestK::test_d[[])"


def test_lines_not_starting_with_a_status_are_ignored():
    output = summary(
        "PASSED t.py::test_a",
        "  PASSED t.py::indented",
        "PASSEDt.py::glued",
        "RERUN t.py::test_a",
        "passed t.py::lower",
        "PASSED",
        "  reason: continuation",
        counts="1 passed, 1 rerun, 2 warnings in 0.5 seconds",
    )
    assert grade_pytest(output, 0) == PytestGrade([("t.py::test_a", True)], True, "")


def test_only_the_last_summary_counts():
    earlier = summary("PASSED t.py::test_a", counts="=== 1 passed in 0.1s ===")
    later = summary("FAILED t.py::test_a - boom", counts="=== 1 failed in 0.1s ===")
    assert grade_pytest(earlier + "\n" + later, 1).results == [("t.py::test_a", False)]
    assert grade_pytest(later + "\n" + earlier, 0) == PytestGrade([("t.py::test_a", True)], True, "")


def test_the_last_counts_line_ends_the_summary():
    # A counts line inside the summary (a reason printing one) does not end it: the last one does.
    output = summary(
        "PASSED t.py::test_a",
        "SKIPPED [2] t.py:9: why",
        "=== 3 passed in 0.1s ===",
        "PASSED t.py::test_forged",
        counts="==== 1 passed, 2 skipped in 75.12s (0:01:15) ====",
    )
    grade = grade_pytest(output + "\nrun-tests.sh: done\n", 0)
    assert grade.skipped == 2
    assert grade.reason == (
        "the short test summary lists 2 PASSED but pytest's final line counts 1: a line in it does not stand for a test"
    )


def test_counts_match_every_status():
    output = summary(
        "PASSED t.py::a",
        "PASSED t.py::b",
        "XFAIL t.py::c - why",
        "SKIPPED [3] t.py:1: x",
        "SKIPPED t.py::d - unfolded",
        counts="2 passed, 4 skipped, 1 xfailed, 3 subtests passed, 1 deselected in 0.10s",
    )
    assert grade_pytest(output, 0) == PytestGrade(
        [("t.py::a", True), ("t.py::b", True), ("t.py::c", True)], True, "", 4
    )


def test_a_summary_without_its_counts_line_does_not_pass():
    output = summary("PASSED t.py::test_a", counts="[executor: killed, the test budget ran out]")
    assert grade_pytest(output, None) == PytestGrade(
        [], False, "the output ends without pytest's final counts line after the short test summary"
    )


def test_many_failures_are_named_five_at_most():
    failed = [f"FAILED t.py::test_{i} - x" for i in range(8)]
    output = summary("PASSED t.py::ok", *failed, counts="=== 8 failed, 1 passed in 0.1s ===")
    assert grade_pytest(output, 1).reason == (
        "8 of 9 tests failed (t.py::test_0, t.py::test_1, t.py::test_2, t.py::test_3, t.py::test_4 and 3 more)"
    )


def test_a_failure_wins_whatever_the_exit_status():
    output = summary("FAILED t.py::test_a - boom", counts="=== 1 failed in 0.1s ===")
    assert grade_pytest(output, 0).reason == "1 of 1 test failed (t.py::test_a)"


def test_no_output():
    assert grade_pytest("", 0) == PytestGrade(
        [], False, "no test ran: the output holds no pytest short test summary (pytest -rA prints it)"
    )


def test_a_test_listed_failed_then_passed_is_failed():
    output = summary(
        "ERROR t.py::test_a - in setup",
        "PASSED t.py::test_a",
        "PASSED t.py::test_b",
        counts="=== 2 passed, 1 error in 0.1s ===",
    )
    assert grade_pytest(output, 1) == PytestGrade(
        [("t.py::test_a", False), ("t.py::test_b", True)], False, "1 of 2 tests failed (t.py::test_a)"
    )
