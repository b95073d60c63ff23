"""Real tasks as their authors wrote them (SPEC §11): pip and npm against the real registries.

Whole evaluations through the pipeline, without and with bubblewrap. The install step has the
host's network (SPEC §12 will put it behind a proxy); the registries' TLS is signed by whatever
CA the host trusts, which the commands must trust too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import pytest

from evaluations.runtime.policy import SANDBOX_CA_BUNDLE
from tests.helpers.archives import Exec
from tests.helpers.runtimes import REGISTRIES
from tests.helpers.tasks import BUGGY, FIXED, SOLVER
from tests.pipeline.test_e2e import evaluate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def config(e2e_config):
    """Registry downloads on a shared machine: a longer install budget than the e2e default, and the
    registries allowed through the egress proxy (the default rules refuse their address here)."""
    return dataclasses.replace(e2e_config, install_timeout_secs=300, egress_allow=REGISTRIES)


# -- Python ----------------------------------------------------------------------

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "tcpkg"
version = "0.1.0"
dependencies = ["tomli>=2"]

[tool.setuptools]
packages = ["tcpkg"]
"""
PACKAGE = "import tomli\n\n\ndef settings(text):\n    return tomli.loads(text)\n\n\n"
PACKAGE_TEST = """\
import os, sys

import tomli
import tcpkg


def test_add():
    assert tcpkg.add(2, 3) == 5


def test_settings_come_from_the_real_dependency():
    assert tcpkg.settings('a = 1') == {'a': 1}
    venv = os.environ['VIRTUAL_ENV']
    assert sys.prefix == venv
    assert tomli.__file__.startswith(venv + '/lib/')  # installed by `pip install -e .`, into the venv
"""
# The agent's commands see what install put in the venv: its python imports the package (and so
# tomli) before the agent fixes it. The agent's own interpreter is the executor's (agentenv.py).
PACKAGE_SOLVER = """\
import pathlib, shutil, subprocess
probe = "import sys, tomli, tcpkg; print(sys.prefix, tomli.__file__)"
prefix, tomli = subprocess.run(['python3', '-c', probe], capture_output=True, text=True, check=True).stdout.split()
print('AGENT', prefix, tomli, shutil.which('pytest'))
f = pathlib.Path('tcpkg/__init__.py')
f.write_text(f.read_text().replace('a - b', 'a + b'))
"""


def test_the_seeds_install_commands_install_a_package_with_a_real_dependency(tasks, config, sandbox):
    url = tasks.task(
        base_files={"pyproject.toml": PYPROJECT, "tcpkg/__init__.py": PACKAGE + BUGGY},
        future={"tcpkg/__init__.py": PACKAGE + FIXED},
        install=["pip install -e .", "pip install pytest"],
        tests={
            "fail_to_pass_add.sh": "python -m pytest -q -p no:cacheprovider test_tcpkg.py -k add\n",
            "pass_to_pass_settings.sh": "pytest -q -p no:cacheprovider test_tcpkg.py -k settings\n",
            "test_tcpkg.py": PACKAGE_TEST,
        },
    )
    evaluation = evaluate(url, PACKAGE_SOLVER, config=config, sandbox=sandbox)
    assert (evaluation.status, evaluation.error) == ("completed", ""), evaluation.error + evaluation.log[-3000:]
    venv = evaluation.agent_output.split()[1]
    assert venv.endswith("/venv"), evaluation.agent_output
    assert f"{venv}/lib/" in evaluation.agent_output and f"{venv}/bin/pytest" in evaluation.agent_output
    assert "1 passed" in evaluation.test_output
    assert "venv" not in evaluation.agent_patch  # the venv is the session's, not the repository's


def test_requirements_and_break_system_packages_work_as_written(tasks, config, sandbox):
    test = "python3 -c 'import tomli, iniconfig, calc; assert calc.add(2, 3) == 5' && pip3 show -q iniconfig\n"
    url = tasks.task(
        base_files={"calc.py": BUGGY, "requirements.txt": "tomli\n"},
        install=["pip install -r requirements.txt", "pip install --break-system-packages iniconfig"],
        tests={"fail_to_pass_add.sh": Exec("#!/bin/bash\n" + test)},
    )
    evaluation = evaluate(url, SOLVER, config=config, sandbox=sandbox)
    assert (evaluation.status, evaluation.error) == ("completed", ""), evaluation.error + evaluation.log[-3000:]


VENV_PROBE = (
    SOLVER
    + """
import json, os, pathlib, shutil, subprocess, sys
# The agent's commands run in the venv (its own interpreter is the executor's, agentenv.py).
code = "import json, sys, sysconfig, installed_mod; print(json.dumps([sys.prefix, sysconfig.get_paths()['purelib']]))"
prefix, site = json.loads(subprocess.run(['python3', '-c', code], capture_output=True, text=True, check=True).stdout)
site = pathlib.Path(site)
names = ['VIRTUAL_ENV', 'PATH', 'HOME', 'PIP_CACHE_DIR', 'npm_config_cache', 'npm_config_prefix', 'GOPATH',
         'GOCACHE', 'CARGO_HOME', 'SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE', 'PIP_CERT', 'NODE_EXTRA_CA_CERTS',
         'npm_config_cafile', 'GIT_SSL_CAINFO', 'CURL_CA_BUNDLE']
pip = subprocess.run(['pip', '--version'], capture_output=True, text=True).stdout
print('PROBE', json.dumps({'env': {n: os.environ.get(n) for n in names}, 'prefix': prefix, 'own': sys.prefix,
      'which': {n: shutil.which(n) for n in ('python', 'python3', 'pip', 'pip3')}, 'pip': pip,
      'site': str(site), 'ca': open(os.environ['SSL_CERT_FILE']).read(27)}))
(site / 'installed_mod.py').unlink()
(site / 'planted.pth').write_text('import planted_mod\\n')
(site / 'planted_mod.py').write_text('raise SystemExit(0)\\n')
"""
)
INSTALL_INTO_VENV = 'echo X = 1 > "$(python -c "import site; print(site.getsitepackages()[0])")/installed_mod.py"'


def test_the_agent_sees_the_venv_and_the_tests_get_it_back_as_install_left_it(tasks, config, sandbox):
    # The agent's planted.pth would make every Python of the tests exit 0 at start, before printing.
    test = "python3 -c 'import installed_mod; print(\"imported\")' | grep -qx imported"
    url = tasks.task(install=[INSTALL_INTO_VENV], tests={"fail_to_pass_venv.sh": Exec("#!/bin/bash\n" + test + "\n")})
    evaluation = evaluate(url, VENV_PROBE, config=config, sandbox=sandbox)
    probe = json.loads(evaluation.agent_output.split("PROBE ", 1)[1])
    env, venv, home = probe["env"], probe["env"]["VIRTUAL_ENV"], probe["env"]["HOME"]
    assert venv == os.path.dirname(home) + "/venv" and probe["prefix"] == venv
    assert probe["own"] != venv  # the agent's own python is not the task's (tests/security/test_agent_secrets.py)
    assert env["PATH"].split(":")[0] == f"{venv}/bin"
    assert probe["which"] == {name: f"{venv}/bin/{name}" for name in ("python", "python3", "pip", "pip3")}
    assert probe["pip"].startswith("pip ") and probe["site"].startswith(venv + "/lib/")
    caches = ("PIP_CACHE_DIR", "npm_config_cache", "npm_config_prefix", "GOPATH", "GOCACHE", "CARGO_HOME")
    assert all(env[name].startswith(home + "/") for name in caches), env
    assert f"{env['npm_config_prefix']}/bin" in env["PATH"].split(":")
    # Under bubblewrap the host's bundle is bound at one fixed path (policy.SANDBOX_CA_BUNDLE).
    bundle = SANDBOX_CA_BUNDLE if sandbox == "bwrap" else str(config.ca_bundle)
    assert {env[name] for name in env if name not in caches + ("VIRTUAL_ENV", "PATH", "HOME")} == {bundle}
    assert probe["ca"] == "-----BEGIN CERTIFICATE-----"  # readable where the command runs
    # What the agent removed and planted is gone: the tests run in the venv the install step left.
    assert (evaluation.status, evaluation.error) == ("completed", ""), evaluation.error + evaluation.test_output


# -- Node ------------------------------------------------------------------------

PACKAGE_JSON = json.dumps({"name": "tc-node", "version": "1.0.0", "private": True,
                           "dependencies": {"is-number": "7.0.0"}})  # fmt: skip
NODE_TEST = (
    "#!/bin/bash\nset -e\n"
    "node -e \"const n = require('is-number'); process.exit(n(5) && !n('five') ? 0 : 1)\"\n"
    "test \"$(semver 1.2.3 -r '>=1.0.0')\" = 1.2.3\n"
)
NODE_AGENT = "#!/bin/bash\nnode -e \"require('is-number')\" && echo AGENT-DEP-OK\nsemver --help | head -1\n"


def _lockfile(tmp_path, config) -> str:
    """package-lock.json of PACKAGE_JSON, as its author would commit it (npm resolves it on the host)."""
    folder = tmp_path / "lock"
    folder.mkdir()
    (folder / "package.json").write_text(PACKAGE_JSON)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "npm_config_cafile": str(config.ca_bundle)}
    done = subprocess.run(["npm", "install", "--package-lock-only"], cwd=folder, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    return (folder / "package-lock.json").read_text()


@pytest.mark.parametrize("install", ["npm install", "npm ci"])
def test_npm_installs_a_real_dependency_and_a_global_tool_without_root(tasks, config, sandbox, install, tmp_path):
    files = {"package.json": PACKAGE_JSON}
    if install == "npm ci":
        files["package-lock.json"] = _lockfile(tmp_path, config)
    url = tasks.task(
        base_files=files,
        future={"README": "later\n"},
        install=[install, "npm install -g semver@7.6.3"],
        tests={"fail_to_pass_node.sh": Exec(NODE_TEST)},
    )
    evaluation = evaluate(url, NODE_AGENT, language="bash", config=config, sandbox=sandbox)
    assert (evaluation.status, evaluation.error) == ("completed", ""), evaluation.error + evaluation.log[-3000:]
    assert "AGENT-DEP-OK" in evaluation.agent_output and "SemVer" in evaluation.agent_output
