"""Install recipes per repository and version, and each row's environment (SPEC §19).

1. Specifications map a repository and a version to a recipe: ``python``,
   ``packages``, ``pip_packages``, ``pre_install``, ``install``, ``test_cmd``,
   ``env`` (and SWE-bench's ``eval_commands``). SWE-bench's own are
   data/swebench_specs.json: ``MAP_REPO_VERSION_TO_SPECS_PY`` of the
   ``swebench`` package 4.1.0, the last release that has them (5.x moved the
   recipes into per-instance Dockerfiles), under its MIT licence
   (data/SWEBENCH-LICENSE). Importing the package instead costs 2.5 s and
   180 MB at every import (``swebench.harness.constants`` drags in docker,
   modal, datasets and 1,600 modules) for one dictionary. An operator's
   ``--specs FILE`` has the same shape; its entries win per repository and
   version. Keys SWE-bench keeps for its own Docker builds (``docker_specs``,
   ``nano_cpus``...) are accepted and not used; any other key is refused.
2. A row's recipe (``recipe_for``): install commands in SWE-bench's order
   (``packages``, ``pip_packages``, ``pre_install`` as one script, ``install``),
   ``pip`` where SWE-bench has conda, the test command, and ``env`` with the
   ``export`` lines of ``eval_commands``. ``--install`` / ``--test-cmd``
   win over everything, then the row's own ``install`` / ``test_cmd``
   (SWE-Forge's), then the recipe, then the defaults (``pip install -e .``,
   pytest). A repository and version with no recipe takes the defaults and
   the command says so once (``note``). With ``--image-template`` the image
   holds the installed environment: nothing is installed unless
   ``--install`` says, and the test command runs in its ``testbed`` conda
   environment, as SWE-bench's evaluation script does.
3. A row's environment (``environment_for``): the image of
   ``--image-template``, else the row's own ``image`` (SWE-bench 5.0's) when
   neither --environment nor --environment-for is given; else ``--environment-for`` by the recipe's Python
   version (a row whose version has none is skipped: ``NoEnvironment``),
   ``--environment`` for a row whose Python version is not known; else
   ``--environment`` for every row, or none (the executor's default).
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from evaluations.environments import BadEnvironment, check_name
from evaluations.images import reference
from evaluations.images.errors import ImageError
from evaluations.tasks.readers import ENV_NAME

from .rows import BadRow, Instance

DEFAULT_TEST_CMD = "python -m pytest -rA -p no:cacheprovider"
DEFAULT_INSTALL = ("pip install -e .",)
DEFAULT_REPO_URL = "https://github.com/{repo}.git"
SWEBENCH_SPECS = Path(__file__).with_name("data") / "swebench_specs.json"
# What SWE-bench's evaluation script runs before the test command in its images.
TESTBED_ACTIVATE = "source /opt/miniconda3/bin/activate && conda activate testbed"
# Where SWE-bench reads a repository's requirements when a recipe's packages are "requirements.txt"
# (harness/constants/python.py MAP_REPO_TO_REQS_PATHS, swebench 4.1.0): the first that exists.
REQUIREMENTS_PATHS = {
    "dbt-labs/dbt-core": ("dev-requirements.txt", "dev_requirements.txt"),
    "django/django": ("tests/requirements/py3.txt",),
    "matplotlib/matplotlib": ("requirements/dev/dev-requirements.txt", "requirements/testing/travis_all.txt"),
    "pallets/flask": ("requirements/dev.txt",),
    "pylint-dev/pylint": ("requirements_test.txt",),
    "pyvista/pyvista": ("requirements_test.txt", "requirements.txt"),
    "sqlfluff/sqlfluff": ("requirements_dev.txt",),
    "sympy/sympy": ("requirements-dev.txt", "requirements-test.txt"),
}
USED_KEYS = ("python", "packages", "pip_packages", "pre_install", "install", "test_cmd", "env", "eval_commands")
# Kept by SWE-bench for its own Docker builds and runs: accepted in a specification, not used here.
IGNORED_KEYS = ("apt-pkgs", "build", "docker_specs", "execute_test_as_nonroot", "nano_cpus", "no_use_env")
PYTHON_VERSION = re.compile(r"[0-9]+\.[0-9]+")
_EXPORT = re.compile(r"export ([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
SAMPLE_ID = "owner__name-1"  # what a template is checked with before any row is read

Specs = dict[str, dict[str, dict]]


@dataclass(frozen=True)
class Options:
    repo_url: str = DEFAULT_REPO_URL
    install: tuple[str, ...] = ()  # --install: for every row, over the row's own
    test_cmd: str | None = None  # --test-cmd: for every row, over the row's own
    environment: str | None = None  # --environment: workspace.yaml `environment` (recipes.environment_for)
    specs: Specs = field(default_factory=dict)  # --specs FILE, over SWE-bench's (recipes.py)
    environment_for: dict = field(default_factory=dict)  # --environment-for: python version -> name or {image}
    image_template: str | None = None  # --image-template: each row's environment is its SWE-bench image


class SpecsError(ValueError):
    """A --specs FILE that cannot be used; the message names the file and the key."""


class OptionError(ValueError):
    """A bad --environment-for or --image-template; the message names the option."""


class NoEnvironment(BadRow):
    """A row whose Python version has no environment (--environment-for): skipped, counted apart."""


@dataclass(frozen=True)
class Recipe:
    python: str | None  # "3.9"; None when no recipe says
    install: list[str]
    test_cmd: str
    env: dict[str, str] = field(default_factory=dict)
    note: str | None = None  # said once per repository and version (no recipe, conda packages...)


# -- specifications ---------------------------------------------------------------------------


def load_specs(path: Path, shown: str | None = None) -> Specs:
    """``path`` as specifications ({repository: {version: recipe}}); SpecsError naming what is wrong."""
    shown = shown or str(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise SpecsError(f"{shown}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecsError(f"{shown}: cannot be read ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecsError(f"{shown} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(data, dict):
        raise SpecsError(
            f'{shown} must be a JSON object of repositories ({{"owner/name": {{"VERSION": {{...}}}}}}), '
            f"not {_kind(data)}"
        )
    specs: Specs = {}
    for repo, versions in data.items():
        if not isinstance(versions, dict):
            raise SpecsError(f"{shown}: {repo} must be an object of versions, not {_kind(versions)}")
        specs[repo] = {version: check_spec(spec, f"{shown}: {repo} {version}") for version, spec in versions.items()}
    return specs


@functools.cache
def swebench_specs() -> Specs:
    """SWE-bench's specifications for its Python repositories (data/swebench_specs.json)."""
    return load_specs(SWEBENCH_SPECS, "SWE-bench's specifications (evaluations/importers/data/swebench_specs.json)")


def check_spec(spec: object, where: str) -> dict:
    """One version's recipe, its keys and their types checked; SpecsError says ``where``."""
    if not isinstance(spec, dict):
        raise SpecsError(f"{where} must be an object (python, packages, install, test_cmd...), not {_kind(spec)}")
    for key, value in spec.items():
        shown = f"{where}: '{key}'"
        if key in IGNORED_KEYS:
            continue
        if key not in USED_KEYS:
            raise SpecsError(f"{where}: unknown key {key!r} (known: {', '.join(USED_KEYS)})")
        if key == "python":
            if not isinstance(value, str) or not PYTHON_VERSION.fullmatch(value):
                raise SpecsError(f'{shown} must be a Python version as a string, such as "3.9"')
        elif key == "packages":
            _text(value, shown)
        elif key in ("pip_packages", "pre_install", "eval_commands"):
            if not isinstance(value, list):
                raise SpecsError(f"{shown} must be a list of strings, not {_kind(value)}")
            for item in value:
                _text(item, shown)
        elif key in ("install", "test_cmd"):
            for item in value if isinstance(value, list) else [value]:
                _text(item, f"{shown} (a string or a list of strings)")
        elif key == "env":
            if not isinstance(value, dict):
                raise SpecsError(f"{shown} must be an object of variable names to strings")
            for name, item in value.items():
                if not ENV_NAME.fullmatch(name):
                    raise SpecsError(f"{shown}: {name!r} is not a variable name ([A-Z_][A-Z0-9_]*)")
                _text(item, f"{shown}: {name}")
    return spec


def _text(value: object, shown: str) -> None:
    if not isinstance(value, str):
        raise SpecsError(f"{shown} must be a string, not {_kind(value)}")
    if "\0" in value:
        raise SpecsError(f"{shown} contains a NUL byte")


def _kind(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def spec_for(instance: Instance, options: Options) -> dict | None:
    """The row's recipe: --specs FILE's for its repository and version, else SWE-bench's; None: neither."""
    if instance.version is None:
        return None
    for specs in (options.specs, swebench_specs()):
        found = specs.get(instance.repo, {}).get(instance.version)
        if found is not None:
            return found
    return None


# -- a row's recipe ---------------------------------------------------------------------------


def recipe_for(instance: Instance, options: Options) -> Recipe:
    """The install commands, test command and variables of the row's task (see the module's 2.)."""
    spec = spec_for(instance, options)
    image = row_image(instance, options) is not None
    note = None
    if spec is None:
        spec = {}
        own = (options.install or instance.install) and (options.test_cmd or instance.test_cmd)
        if not image and not own:
            what = f"{instance.repo} {instance.version}" if instance.version else f"{instance.repo} (no version)"
            note = f"no install recipe for {what}: the row's own install and test_cmd, else the defaults"
    commands, eval_env = _eval_commands(spec.get("eval_commands", []))
    env = {**eval_env, **spec.get("env", {})}
    if image:
        install = list(options.install)
    elif options.install or instance.install:
        install = list(options.install or instance.install)
    elif spec:
        install, note = _install(instance, spec)
    else:
        install = list(DEFAULT_INSTALL)
    test_cmd = options.test_cmd or instance.test_cmd or _joined(spec.get("test_cmd")) or DEFAULT_TEST_CMD
    prefix = ([TESTBED_ACTIVATE] if image else []) + [f"{{ {command}; true; }}" for command in commands]
    return Recipe(
        python=spec.get("python"),
        install=install,
        test_cmd=" && ".join([*prefix, test_cmd]),
        env=env,
        note=note,
    )


def _install(instance: Instance, spec: dict) -> tuple[list[str], str | None]:
    """SWE-bench's environment and repository set-up as install commands: packages, pip_packages,
    pre_install, install. Conda's part is pip's here; an environment.yml cannot be."""
    install, note = [], None
    packages = spec.get("packages", "")
    if packages == "requirements.txt":
        install.append(_requirements(REQUIREMENTS_PATHS.get(instance.repo, ("requirements.txt",))))
    elif packages == "environment.yml":
        note = (
            f"the install recipe for {instance.repo} {instance.version} takes its packages from a conda "
            "environment.yml, which is not installed here: the rest of the recipe is (--install overrides it)"
        )
    elif packages.strip():
        install.append(f"python -m pip install {packages}")  # a shell fragment: quoted where it needs to be
    if spec.get("pip_packages"):
        install.append("python -m pip install " + " ".join(shlex.quote(p) for p in spec["pip_packages"]))
    pre_install = spec.get("pre_install", [])
    if len(pre_install) == 1:
        install.append(pre_install[0])
    elif pre_install:  # one script, as SWE-bench runs them: a variable set by one is there for the next
        install.append("\n".join(["set -e", *pre_install]))
    steps = spec.get("install")
    install += steps if isinstance(steps, list) else [steps] if steps else []
    return install, note


def _requirements(paths: tuple[str, ...]) -> str:
    """pip install -r of the first of ``paths`` the repository has (at base_commit: SWE-bench reads it
    at environment_setup_commit, which is not in the task)."""
    if len(paths) == 1:
        return f"python -m pip install -r {shlex.quote(paths[0])}"
    listed = " ".join(shlex.quote(p) for p in paths)
    return (
        f'for f in {listed}; do if [ -f "$f" ]; then exec python -m pip install -r "$f"; fi; done; '
        f"echo 'none of {', '.join(paths)} is in the repository' >&2; exit 1"
    )


def _eval_commands(lines: list[str]) -> tuple[list[str], dict[str, str]]:
    """SWE-bench's eval_commands: ``export NAME=VALUE`` lines as variables, the rest as commands whose
    failure is ignored (its evaluation script runs them without ``set -e``)."""
    commands, env = [], {}
    for line in lines:
        found = _EXPORT.fullmatch(line.strip())
        if found and ENV_NAME.fullmatch(found[1]):
            try:
                value = shlex.split(found[2])
            except ValueError:
                value = None
            if value is not None and len(value) <= 1:
                env[found[1]] = value[0] if value else ""
                continue
        commands.append(line)
    return commands, env


def _joined(test_cmd: str | list[str] | None) -> str | None:
    if isinstance(test_cmd, list):
        return " && ".join(test_cmd) or None
    return test_cmd or None


# -- a row's environment ----------------------------------------------------------------------


def environment_for(instance: Instance, recipe: Recipe, options: Options) -> str | dict | None:
    """workspace.yaml's ``environment`` for the row (a name, ``{"image": REF}``, or None: the
    executor's default); NoEnvironment when --environment-for has none for its Python version."""
    ref = row_image(instance, options)
    if ref is not None:
        try:
            reference.parse(ref)
        except ImageError as exc:
            source = "--image-template" if options.image_template is not None else "the row's image"
            raise BadRow(instance.instance_id, f"{source} gives no image reference for this id: {exc}") from None
        return {"image": ref}
    if not options.environment_for:
        return options.environment
    if recipe.python is None:
        if options.environment:
            return options.environment
        raise NoEnvironment(
            instance.instance_id,
            "no environment for python of this row: no install recipe gives its version "
            "(--environment names one for such rows)",
        )
    chosen = options.environment_for.get(recipe.python)
    if chosen is None:
        raise NoEnvironment(instance.instance_id, f"no environment for python {recipe.python}")
    return chosen


def row_image(instance: Instance, options: Options) -> str | None:
    """The SWE-bench image the row runs in, or None: --image-template's; else the row's own ``image``
    (SWE-bench 5.0) unless --environment or --environment-for chose the environments."""
    if options.image_template is not None:
        return image_for(options.image_template, instance.instance_id)
    if instance.image is not None and not options.environment and not options.environment_for:
        return instance.image
    return None


def image_for(template: str, instance_id: str) -> str:
    """``template`` with ``{id}`` replaced as SWE-bench names its images: lower case, ``__`` as ``_1776_``."""
    return template.replace("{id}", instance_id.replace("__", "_1776_").lower())


def check_image_template(template: str) -> str:
    """The template if it has ``{id}``, no other placeholder, and gives an image reference."""
    unknown = [name for name in _PLACEHOLDER.findall(template) if name != "id"]
    if unknown:
        raise OptionError(f"--image-template: unknown placeholder {{{unknown[0]}}}; only {{id}} is replaced")
    if "{id}" not in template:
        raise OptionError("--image-template must contain {id} (the instance id, as SWE-bench names its images)")
    try:
        reference.parse(image_for(template, SAMPLE_ID))
    except ImageError as exc:
        raise OptionError(f"--image-template {template!r} does not give an image reference: {exc}") from None
    return template


def parse_environment_for(values: list[str]) -> dict[str, str | dict]:
    """``PYVER=NAME_OR_IMAGE`` options as {python version: environment name or {"image": REF}}.

    A value with ``/``, ``:`` or ``@`` is an image reference (no environment name has them); any
    other is an environment name under ENVIRONMENTS_ROOT."""
    chosen: dict[str, str | dict] = {}
    for value in values:
        version, sep, target = value.partition("=")
        if not sep or not target:
            raise OptionError(
                f"--environment-for {value!r}: expected PYVER=NAME_OR_IMAGE, such as 3.9=py39 or 3.9=python:3.9"
            )
        if not PYTHON_VERSION.fullmatch(version):
            raise OptionError(f"--environment-for {value!r}: {version!r} is not a Python version such as 3.9")
        if version in chosen:
            raise OptionError(f"--environment-for: python {version} is given twice")
        if any(c in target for c in "/:@"):
            try:
                reference.parse(target)
            except ImageError as exc:
                raise OptionError(f"--environment-for {value!r}: {exc}") from None
            chosen[version] = {"image": target}
        else:
            try:
                chosen[version] = check_name(target)
            except BadEnvironment as exc:
                raise OptionError(
                    f"--environment-for {value!r}: {exc} (an image reference has a '/' or a ':')"
                ) from None
    return chosen
