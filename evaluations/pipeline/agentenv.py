"""An agent project's own environment (SPEC §14): the step installing_agent, and how it runs.

1. The archive (agent_archive) is extracted into ``<session>/agent/code`` by
   evaluations/agents.py, with the task archives' rules: root's files, which
   the sandbox uid reads and never writes.
2. Its dependencies go to ``<session>/agent/env``, the sandbox uid's, never to
   the repository or the task venv:
   - python: a venv made by toolchains.make_venv (the interpreter the task's
     commands would find), its ``requirements.txt`` installed with that venv's pip.
     The agent runs with the venv's python.
   - node: ``package.json`` (and ``package-lock.json``) copied into env/ and
     ``npm install --prefix env``; ``code/node_modules`` is a link to
     ``env/node_modules``, so ``require`` and ``import`` from the code find them.
     A project that ships its own ``node_modules`` is used as it is, with no install.
   - bash: nothing to install.
3. Every command goes through the evaluation's spawner with the task's policy
   (network per AGENT_NETWORK, through the egress proxy) and CA trust, within
   INSTALL_TIMEOUT_SECS, with the agent's env, its own HOME
   (``<session>/agent/home``: caches, pip's and npm's config) and the executor's
   PATH: nothing the task's install step wrote runs with the agent's secrets. A
   command that fails fails the evaluation as ``agent_invalid`` with its last line.
4. The agent runs with an interpreter the executor chose (``find_interpreter``,
   at downloading_task), started without the hooks of its environment
   (``languages.Language.start_options``); the task's ``env`` reaches it without
   the variables that load code at a program's start (``START_HOOKS``). The
   commands the agent starts keep the task's PATH (task venv first); the tests
   never see agent/ (their sandbox does not bind it).

A single-file agent (agent_code) has nothing to install: the step is recorded and returns.
"""

from __future__ import annotations

import dataclasses
import os
import shutil

from evaluations import agents, languages
from evaluations.environments import toolchains
from evaluations.models import ErrorKind
from evaluations.pipeline import outcome, static
from evaluations.pipeline.context import Context, StepFailed, deadline_in, last_line, limit_failure, remaining
from evaluations.runtime import Mount

NPM_FILES = ("package.json", "package-lock.json", "npm-shrinkwrap.json")


def installing_agent(ctx: Context) -> None:
    evaluation = ctx.evaluation
    if evaluation.agent_archive_id is None:
        return  # one file, nothing to install
    session = ctx.session
    try:
        project = agents.unpack(
            bytes(evaluation.agent_archive.data),
            session.agent_code,
            language=evaluation.language,
            entrypoint=evaluation.agent_entrypoint,
            config=ctx.config,
        )
    except agents.ProjectError as exc:
        raise StepFailed(f"{exc.field}: {exc}", kind=outcome.of_fetch(exc)) from None  # our disk, or the step's rule
    for folder in (session.agent_env, session.agent_home):  # in root's agent/: no link stands there
        session.make_folder(folder, 0o755 if folder == session.agent_env else 0o700, owner=session.uid_owner)
    installer = _Installer(ctx)
    if evaluation.language == "python":
        _python(ctx, project, installer)
    elif evaluation.language == "node":
        _node(ctx, project, installer)


def find_interpreter(ctx: Context) -> str | None:
    """The absolute path of the agent language's interpreter, found on the executor's PATH
    (``ctx.command_path``: the host's runtimes and system folders, or the environment's, kinds.py), never
    on the task's (its venv, npm, Go and Cargo bins come first there, and the task writes them).
    downloading_task resolves it, before any command of the task runs; None: not installed."""
    language = languages.ALL.get(ctx.evaluation.language)
    if language is None:
        return None
    return ctx.env.find_program(language.interpreter)


def agent_argv(ctx: Context, language: languages.Language, prompt: str) -> list[str]:
    """The command of the agent: an agent project's entry point with its own interpreter, or
    the single file running_agent writes, with the interpreter downloading_task chose."""
    session = ctx.session
    if ctx.evaluation.agent_archive_id is None:
        return language.argv(str(session.agent / f"agent.{language.extension}"), prompt, ctx.agent_interpreter)
    code = session.agent_code
    entry = agents.find(code, agents.Folder(code), language.name, ctx.evaluation.agent_entrypoint).entry
    interpreter = ctx.agent_interpreter
    if language.name == "python" and (session.agent_env / "pyvenv.cfg").is_file():
        interpreter = str(session.agent_env / "bin" / "python3")  # the venv made here, with the same python
    return language.argv(str(entry), prompt, interpreter)


def task_env_for_agent(ctx: Context) -> dict[str, str]:
    """The task's ``env`` as the agent's processes get it: without what would make the agent's own
    interpreter (or the dynamic loader before it) run code the task wrote as it starts."""
    return {name: value for name, value in static.task_env(ctx).items() if not _start_hook(name)}


def _start_hook(name: str) -> bool:
    return name.startswith("LD_") or name in START_HOOKS


# Read by a program as it starts, naming code to load: the dynamic loader's LD_* (LD_PRELOAD,
# LD_LIBRARY_PATH, LD_AUDIT) and glibc's GCONV_PATH for every interpreter, bash's and sh's start
# files for the shells the agent starts, node's options and module path. Python's PYTHON* are
# ignored by the agent's interpreter (-E, languages.py) and left for the commands it starts.
START_HOOKS = frozenset({"GCONV_PATH", "BASH_ENV", "ENV", "NODE_OPTIONS", "NODE_PATH"})


def _python(ctx: Context, project: agents.Project, installer: _Installer) -> None:
    python = ctx.env.python()
    requirements = project.root / "requirements.txt"
    if python is None:
        if agents.is_file(requirements):
            raise StepFailed("requirements.txt: no python3 to make the agent's venv with", kind=ErrorKind.AGENT_INVALID)
        return
    toolchains.make_venv(ctx.session.agent_env, python, ctx.session.uid)  # cheap: a few files, no process
    if agents.is_file(requirements):
        pip = [str(ctx.session.agent_env / "bin" / "python3"), "-m", "pip", "install", "--no-input", "-r"]
        installer.run([*pip, str(requirements)], "pip install -r requirements.txt")


def _node(ctx: Context, project: agents.Project, installer: _Installer) -> None:
    env_dir = ctx.session.agent_env
    if not agents.is_file(project.root / "package.json") or os.path.lexists(project.root / "node_modules"):
        return  # nothing declared, or the project ships its packages
    for name in NPM_FILES:
        if agents.is_file(project.root / name):
            shutil.copyfile(project.root / name, env_dir / name, follow_symlinks=False)
            if ctx.session.uid is not None:
                os.chown(env_dir / name, ctx.session.uid, ctx.session.uid)  # npm rewrites its lock file
    installer.run(["npm", "install", "--prefix", str(env_dir), "--no-audit", "--no-fund"], "npm install")
    os.symlink(env_dir / "node_modules", project.root / "node_modules")  # root's link in root's folder


class _Installer:
    """The agent's install commands: the task's policy and environment, with the agent's env/ writable."""

    def __init__(self, ctx: Context):
        session = ctx.session
        self.ctx = ctx
        self.deadline = deadline_in(ctx.config.install_timeout_secs)
        home = session.agent_home
        mounts = [
            Mount(session.agent_code, str(session.agent_code), writable=False),
            Mount(session.agent_env, str(session.agent_env), writable=True),
            Mount(home, str(home), writable=True),
            Mount(session.repo, str(session.repo), writable=False),  # its working folder, read-only
        ]
        # Its own folders and /tmp writable, not the task's repository, HOME or venv: what
        # running_agent meets there before the agent runs (static assets' paths) is the task's.
        policy = ctx.task_policy(network=ctx.config.agent_network, mounts=mounts, loopback=True)
        self.policy = dataclasses.replace(policy, writable=(session.tmp,))
        # Nothing the task wrote: not its PATH (venv, npm, Go and Cargo bins: `npm` would be found
        # there), nor its HOME (a usercustomize or .pth in the user site, pip.conf, .npmrc's
        # script-shell, .gitconfig, poisoned caches), nor its env. The agent's env is given here.
        base = {**ctx.base_env(), **toolchains.home_env(home), "PATH": ctx.command_path}
        base.pop("VIRTUAL_ENV", None)
        self.env = {**base, **ctx.evaluation.env}
        if (session.agent_env / "pyvenv.cfg").is_file():  # build backends calling `python` get the agent's
            self.env |= {"VIRTUAL_ENV": str(session.agent_env), "PATH": f"{session.agent_env}/bin:{base['PATH']}"}

    def run(self, argv: list[str], what: str) -> None:
        config = self.ctx.config
        result = self.ctx.run(argv, env=self.env, timeout_secs=remaining(self.deadline), policy=self.policy)
        failure = limit_failure(result, what, "INSTALL_TIMEOUT_SECS", config.install_timeout_secs)
        if failure:
            raise failure
        if result.exit_code != 0:
            raise StepFailed(
                f"{what} exited with code {result.exit_code}: {last_line(result.output)}",
                kind=ErrorKind.AGENT_INVALID,
            )
        self.ctx.spawner.sweep()
