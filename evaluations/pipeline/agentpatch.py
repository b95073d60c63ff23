"""The agent's patch as the pipeline makes it (SPEC §25): in a sandbox of the executor's own, never the
agent's, and as little of it on the evaluation's path as what the agent left allows.

1. ``start`` (once the agent runs): the patch's sandbox prestarted beside the agent's, and the base
   commit read in it meanwhile (``patch.read_base``: it reads root's copy of the base's objects,
   which the agent cannot reach, and writes only its own scratch folder).
2. After the agent's end, ``beside`` where the tests can have a view of their own of the repository
   (pipeline/repoview.py: the tests write in an overlay whose lower layer is the repository as the
   agent left it): the rest of the patch is made in that sandbox on a thread of its own
   (``Spawner.beside``) while the tests run, and ``take`` gives it at the tests' end. A patch that
   did not finish there (its sandbox killed with the rest of the evaluation by a test's limit, a
   git failure) is made again in the patch's phase, from the repository the view left unchanged,
   which reports it as before.
3. Else ``now``: made in the patch's phase before the tests, as before (``meanwhile``: the tests'
   HOME and /tmp reset and their sandbox started while its first script runs).

Either way the patch is staged with its step's result: ``now``'s with the agent's output,
``beside``'s at the tests' end (or at cleanup when the tests never end: ``settle``), and the row's
``agent_patch`` is the same text. What differs beside the tests: git's messages are not in the live
log (an early command's output is its own), and a cancel during the tests ends the patch with them.
"""

from __future__ import annotations

from collections.abc import Callable

from evaluations.network import urlguard
from evaluations.pipeline import gitrepo, patch, repoview
from evaluations.pipeline.context import Context
from evaluations.runtime.spawner import EarlyRun

PATCH_PHASE = "patch"  # the executor's git work on what the agent left: never in the agent's sandbox
UNFINISHED = "(no patch: the evaluation ended before its patch was made)"


class AgentPatch:
    """One evaluation's agent patch: ``start``; then ``beside`` (and ``take`` at the tests' end, or
    ``settle`` at cleanup) or ``now``; then ``remove``."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.base: patch.PatchBase | None = None  # read while the agent ran
        self.text: str | None = None  # made beside the tests
        self.pending = False  # made beside the tests, not yet taken

    # -- while the agent runs ------------------------------------------------------------------

    def start(self) -> None:
        """Once the agent runs (``Spawner.run``'s ``meanwhile``, so that the agent's own sandbox
        started alone): the patch's sandbox launched, apart from the agent's, reading the base
        commit once it runs, where the agent cannot reach it. Nothing for a task without a
        repository."""
        ctx = self.ctx
        if ctx.task.repo is not None:
            then = self._read_base if ctx.runtime.isolated else None
            ctx.prestart(PATCH_PHASE, ctx.executor_policy(network=False), ctx.session.repo, then=then)

    def _read_base(self, run: EarlyRun) -> None:
        ctx = self.ctx
        try:
            self.base = patch.read_base(
                run, repo=ctx.session.repo, base_sha=ctx.base_sha, base_objects=ctx.session.base_objects, env=_env(ctx)
            )
        except gitrepo.GitError:
            pass  # made again, and reported, by the patch's phase

    # -- after the agent's end -----------------------------------------------------------------

    def beside(self, tests_shared: bool, ahead: Callable[[], None]) -> bool:
        """The tests' view of the repository mounted, ``ahead`` called (the tests' HOME and /tmp
        reset, their sandbox started, with the view bound: before the patch's git takes a CPU), then
        the rest of the patch started beside the tests; False (nothing done) where it cannot be: no
        sandbox of the patch's prestarted, no view (repoview.py), or the tests elsewhere than in the
        agent's environment's shared sandbox (``tests_shared`` False: an image's; a separate
        verifier's; a task of [[steps]], whose next step starts from what the tests left; compose
        services, which may bind the repository)."""
        ctx = self.ctx
        if not tests_shared or ctx.steps is not None or ctx.services or ctx.separate_envs() or not ctx.runtime.isolated:
            return False
        if not ctx.spawner.prestarted(PATCH_PHASE):
            return False
        view = repoview.mount(ctx.session.root, ctx.session.repo)
        if view is None:
            return False
        ctx.closing.callback(repoview.unmount, ctx.session.root)  # after the tests' sandbox's end
        ctx.closing.callback(self.settle)
        ctx.env.view_repo(view)
        self.pending, ctx.take_patch = True, self.take
        ahead()
        ctx.spawner.beside(PATCH_PHASE, self._make)
        return True

    def _make(self, run: EarlyRun) -> None:
        try:
            self.text = self._patch(run)
        except gitrepo.GitError:
            pass  # made again, and reported, by the patch's phase

    def now(self, meanwhile: Callable[[], None] | None = None) -> str:
        """The patch, made in the patch's phase (its prestarted sandbox, where the base was read);
        ``meanwhile`` runs while its first script runs."""
        ctx = self.ctx
        try:
            # Its end awaited with the tests' end (retire).
            with ctx.phase(PATCH_PHASE, executor=True, retire=True):
                if self.text is not None:  # made beside the tests
                    return self.text
                runner = ctx.command_runner(ctx.executor_policy(network=False), meanwhile=meanwhile)
                return self._patch(runner)
        except gitrepo.GitError as exc:
            return f"(no patch: {exc})"

    def _patch(self, run) -> str:
        # HOME is never the agent's: repo_patch gives git an empty folder of its own, reads ignore
        # rules and attributes from the base commit's tree only, and the base's objects from the copy
        # made at clone time, never from the agent's .git (issue 23).
        ctx, base, self.base = self.ctx, self.base, None
        return patch.repo_patch(
            run,
            repo=ctx.session.repo,
            base_sha=ctx.base_sha,
            base_objects=ctx.session.base_objects,
            env=_env(ctx),
            exclude=ctx.asset_excludes,
            max_bytes=ctx.config.max_output_bytes * 8,
            base=base,
        )

    def take(self) -> None:
        """At the tests' end: the patch made beside them staged (made again in its phase if it did
        not finish there); after a cancel, what was made, the rest ended with its sandbox."""
        ctx = self.ctx
        if not self.pending:
            return
        self.pending, ctx.take_patch = False, None
        if ctx.cancel.is_set():
            ctx.spawner.end_prestart(PATCH_PHASE)
            text = self.text if self.text is not None else UNFINISHED
        else:
            text = self.now()
        ctx.stage(agent_patch=text)

    def settle(self) -> None:
        """At cleanup, when the tests never took it (the evaluation ended between the steps): its
        sandbox is ended by then (run._cleanup), and the patch is what it made."""
        if self.pending:
            self.pending = False
            self.ctx.stage(agent_patch=self.text if self.text is not None else UNFINISHED)
        self.remove()

    def remove(self) -> None:
        """What is left of the base's reading (the patch removes it once made)."""
        if self.base is not None:
            base, self.base = self.base, None
            base.remove()


def _env(ctx: Context) -> dict[str, str]:
    return gitrepo.git_env(ctx.session.home, urlguard.git_allow_protocol(False))
