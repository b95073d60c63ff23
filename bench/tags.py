"""``python -m bench.tags [--runs N] [--per-side N]``: what keeping the past's tags costs the clone (issue 27).

Every figure is measured in this run, on this machine, and printed; none is judged by an assertion.

A repository of 200 commits (tests.helpers.gitrepos.make_many_tags) with ``--per-side`` annotated
and as many lightweight tags on the base's ancestors, and as many on later commits (4000 tags by
default), and the same repository with no tag at all, each cloned at the base with ``clone_at``
(file://) and with ``clone_from_mirror`` (from a mirror made beforehand), ``--runs`` times each:
the median wall time, and the tags the result holds. Then listing the kept tags two ways on the
tagged repository: ``for-each-ref --merged BASE`` once (what the clone does) against a
``merge-base --is-ancestor TAG BASE`` per tag (a process per tag). Git runs as plain processes,
not in the sandbox: the sandbox costs the same per command either way.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

from bench.common import bench_folder, load_average, median
from evaluations.pipeline.gitrepo import clone_at, git_env
from evaluations.pipeline.mirror import clone_from_mirror, update_mirror
from evaluations.safefs import remove_tree_nofollow
from tests.helpers.gitrepos import GIT_TEST_ENV, git, make_bare, make_many_tags, subprocess_runner


def _timed(runs: int, dest: Path, clone) -> tuple[float, int]:
    times = []
    for _ in range(runs):
        if dest.exists():
            remove_tree_nofollow(dest)
        started = time.monotonic()
        clone(dest)
        times.append(time.monotonic() - started)
    return median(times), len(git(dest, "tag").split())


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tags")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--per-side", type=int, default=1000)
    args = parser.parse_args()
    with bench_folder() as root:
        src, base, kept = make_many_tags(root / "src", args.per_side)
        tagged = make_bare(src, root / "tagged.git")
        bare = make_bare(src, root / "untagged.git")
        subprocess.run(["git", "tag", "-d", *git(bare, "tag").split()], cwd=bare, env=GIT_TEST_ENV, capture_output=True, check=True)  # fmt: skip
        git(bare, "gc", "--quiet", "--prune=now")
        (root / "home").mkdir()
        env = git_env(root / "home", "file")
        print(f"load average {load_average()}; {4 * args.per_side} tags, {len(kept)} on the base's ancestors")
        for name, repo in (("no tags", bare), (f"{4 * args.per_side} tags", tagged)):
            mirror = root / f"mirror-{repo.name}"
            update_mirror(subprocess_runner, mirror=mirror, repo_url=repo.as_uri(), env=env, timeout_secs=120)
            ways = {
                "clone_at": lambda d, repo=repo: clone_at(
                    subprocess_runner, repo_url=repo.as_uri(), base_commit=base, dest=d, env=env, timeout_secs=120
                ),
                "clone_from_mirror": lambda d, mirror=mirror: clone_from_mirror(
                    subprocess_runner, mirror=mirror, base_commit=base, dest=d, env=env, timeout_secs=120
                ),
            }
            for way, clone in ways.items():
                seconds, tags = _timed(args.runs, root / "dest", clone)
                print(f"{name:>12}  {way:<18} {seconds * 1000:7.1f} ms median of {args.runs}, {tags} tags kept")
        started = time.monotonic()
        merged = git(tagged, "for-each-ref", "--merged", base, "--format=%(refname)", "refs/tags").split()
        one_pass = time.monotonic() - started
        started = time.monotonic()
        per_tag = 0
        for ref in git(tagged, "for-each-ref", "--format=%(refname)", "refs/tags").split():
            per_tag += subprocess.run(["git", "merge-base", "--is-ancestor", ref, base], cwd=tagged, env=GIT_TEST_ENV).returncode == 0  # fmt: skip
        each = time.monotonic() - started
        print(f"listing: for-each-ref --merged {one_pass * 1000:.1f} ms ({len(merged)} tags);"
              f" merge-base per tag {each * 1000:.0f} ms ({per_tag} tags)")  # fmt: skip


if __name__ == "__main__":
    main()
