"""``python -m bench.signing [--runs N]``: what signing results costs (issue 28, SPEC §18).

Every figure is measured in this run, on this machine, and printed; none is judged by an assertion.

Two evaluation objects, as representation.evaluation_json builds them from rows in a SQLite
database of the run's own: a typical one (3 tests of a few lines, a 2 KB patch) and a heavy one
(1 MiB of test output in its test_results, which are signed, and a 1 MiB patch, whose sha256 is).
For each: the RFC 8785 canonical form alone, sign (canonical + Ed25519), verify, the median of
``--runs``. Then lifecycle.finish on running evaluations of each kind (``--runs``/2 typical,
``--runs``/4 heavy), with signing (as it is: the row read back and signed inside finish's
transaction) and without (the sealing step replaced by nothing), interleaved so both see the same
machine; and the sealing step alone (read back, sign, store) on an ended row.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.common import django_in, load_average, median

MIB = 1024 * 1024


def running(heavy: bool):
    """A running evaluation with its test results, as running_tests leaves it."""
    from evaluations.models import Evaluation, Status, TestResult

    output = "".join(f"line {i:07d} " + "x" * 80 + "\n" for i in range(MIB // 94 // 3)) if heavy else "ok\n" * 5
    patch = "+" + "y" * (MIB if heavy else 2048) + "\n"
    evaluation = Evaluation.objects.create(
        task_url="http://127.0.0.1/task.tar.gz", agent_code="print(1)", agent_sha256="a" * 64, status=Status.RUNNING,
        task_sha256="b" * 64, agent_patch=patch, agent_output=output, test_output=output,
        environment={"kind": "host", "ref": None, "digest": None, "cached": False},
    )  # fmt: skip
    for n in range(3):
        TestResult.objects.create(evaluation=evaluation, name=f"fail_to_pass_{n}", kind="fail_to_pass", passed=True,
                                  exit_code=0, position=n, output=output)  # fmt: skip
    return evaluation


def timed(runs: int, call) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory(prefix="bench-signing-") as folder:
        django_in(Path(folder))
        from evaluations import lifecycle, signing
        from evaluations.models import Evaluation, Status
        from evaluations.representation import evaluation_json

        print(f"load average {load_average()}, {runs} runs each, medians")
        for heavy in (False, True):
            name = "1 MiB test output" if heavy else "typical"
            evaluation = running(heavy)
            lifecycle.finish(evaluation.id, Status.COMPLETED)
            document = evaluation_json(Evaluation.objects.prefetch_related("test_results").get(id=evaluation.id))
            fields = signing.EVALUATION_FIELDS
            key = signing.default_keyring().find(document["signature"]["key_id"]).verifier()
            size = len(signing.canonical(document, fields))
            canonical = timed(runs, lambda: signing.canonical(document, fields))  # noqa: B023
            signed = timed(runs, lambda: signing.sign(document, fields))  # noqa: B023
            verified = timed(runs, lambda: signing.verify(document, key))  # noqa: B023
            print(f"{name}: canonical {size} bytes {canonical * 1e3:.3f} ms, sign {signed * 1e3:.3f} ms, "
                  f"verify {verified * 1e3:.3f} ms")  # fmt: skip
            finish_runs = max(10, runs // (4 if heavy else 2))
            rows = [running(heavy) for _ in range(2 * finish_runs)]
            sealing = lifecycle._seal_evaluation
            with_signing, without = [], []
            for n, row in enumerate(rows):
                off = n % 2 == 1
                lifecycle._seal_evaluation = (lambda eval_id: None) if off else sealing
                started = time.perf_counter()
                lifecycle.finish(row.id, Status.FAILED, kind="tests_failed")
                (without if off else with_signing).append(time.perf_counter() - started)
            lifecycle._seal_evaluation = sealing
            sealed = timed(finish_runs, lambda: sealing(rows[0].id))  # noqa: B023  read back, sign, store
            print(f"{name}: lifecycle.finish {median(with_signing) * 1e3:.2f} ms signed, "
                  f"{median(without) * 1e3:.2f} ms unsigned ({finish_runs} each, interleaved); "
                  f"its sealing step alone {sealed * 1e3:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
