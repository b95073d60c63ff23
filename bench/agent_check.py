"""``python -m bench.agent_check [--rounds N]``: what the API's check of an agent archive costs a web worker.

POST /evaluate and POST /batches check an ``agent_archive`` before admitting it
(``evaluations.agents.check``). Three archives, each under MAX_AGENT_ARCHIVE_BYTES:

1. a small project (two files);
2. 9 MiB of random bytes (incompressible: as large as the cap lets an archive be);
3. 400 MiB of zeros (about 400 KB compressed: under MAX_EXTRACTED_BYTES, 500 MB).

For each: the median wall time of a check and the bytes the process wrote (``wchar`` of
/proc/self/io: every write(), to disk or page cache), per check. Run it in two checkouts
to compare (the figures of issue 17's follow-up are in bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tarfile
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "executor_project.settings")
django.setup()

from django.conf import settings  # noqa: E402

from evaluations import agents  # noqa: E402


def tar_gz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def written() -> int:
    with open("/proc/self/io") as handle:
        return int(next(line for line in handle if line.startswith("wchar:")).split()[1])


def measure(data: bytes, rounds: int) -> tuple[float, float]:
    times, writes = [], []
    for _ in range(rounds):
        before_bytes, started = written(), time.perf_counter()
        agents.check(data, language="python", entrypoint="", config=settings.EXECUTOR)
        times.append(time.perf_counter() - started)
        writes.append(written() - before_bytes)
    return statistics.median(times) * 1000, statistics.median(writes) / (1 << 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    agent = {"agent.py": b"import helper\n", "helper.py": b"x = 1\n"}
    archives = {
        "small project": tar_gz(agent),
        "9 MiB random": tar_gz({**agent, "weights.bin": os.urandom(9 << 20)}),
        "400 MiB of zeros": tar_gz({**agent, "zeros.bin": bytes(400 << 20)}),
    }
    print(f"{'archive':<18} {'size':>10} {'check ms':>9} {'written MiB':>12}")
    for name, data in archives.items():
        ms, mib = measure(data, rounds)
        print(f"{name:<18} {len(data):>10} {ms:>9.1f} {mib:>12.1f}")


if __name__ == "__main__":
    main()
