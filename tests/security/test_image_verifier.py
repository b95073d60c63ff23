"""What an image task's verifier runs (SPEC §21, issue 34 items 3 and 4), through real evaluations.

1. ``[verifier] isolated = true`` on an image whose ``Env`` puts ``/app/bin`` (inside its
   ``WorkingDir``) first on ``PATH``: an agent that plants ``/app/bin/bash`` and ``/app/bin/cat``
   (each writing a reward of 1) must not be run by the verifier, and ``system_changes.suspicious``
   names both. An honest agent still gets its reward from the same verifier.
2. An image task gets no venv of the executor: the agent's and the verifier's ``python3`` are the
   image's, no ``VIRTUAL_ENV``, nothing of the session on ``PATH``; a ``sitecustomize.py`` the agent
   plants where the session's venv used to be is never run by the verifier.

The images are the suite's Debian tree (``base_layer``) pushed to the registry on 127.0.0.1 with a
config of the test's own, named by ``[environment] docker_image``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.archives import Exec, write_archive
from tests.helpers.images import push_image
from tests.security.support import evaluate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture
def config(image_task_config):
    return image_task_config


def image(base_image, base_layer, name: str, env: list[str]) -> str:
    registry, _, _ = base_image
    config = {"Env": env, "WorkingDir": "/app", "Cmd": ["bash"]}
    return push_image(registry, f"test/{name}:latest", layers=[base_layer], config=config).ref


def harbor_task(tasks, ref: str, test: str, *, isolated: bool) -> str:
    """A Harbor task on the image ``ref`` with ``test`` as tests/test.sh; its URL."""
    toml = f'[environment]\ndocker_image = "{ref}"\n\n[verifier]\nisolated = {str(isolated).lower()}\n'
    files = {"task.toml": toml, "instruction.md": "Write 42 to /app/answer.txt.\n", "tests/test.sh": Exec(test)}
    name = f"verifier-{os.urandom(4).hex()}.tar.gz"
    write_archive(Path(tasks.www) / name, files, "tar.gz", top="task")
    return f"{tasks.base_url}/{name}"


ANSWER_TEST = b"""\
#!/bin/bash
if [ "$(cat /app/answer.txt)" = 42 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
FORGER = "#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n"
PLANT_ON_PATH = f"""\
mkdir -p /app/bin
for name in bash cat; do printf '{FORGER}' > /app/bin/$name && chmod +x /app/bin/$name; done
ls -l /app/bin
"""


def test_an_isolated_verifier_never_runs_what_the_agent_put_on_a_path_folder_in_its_working_directory(
    tasks, config, base_image, base_layer
):
    ref = image(base_image, base_layer, "path-in-workdir", [f"PATH=/app/bin:{SYSTEM_PATH}"])
    url = harbor_task(tasks, ref, ANSWER_TEST, isolated=True)
    planted = evaluate(url, PLANT_ON_PATH, config=config, sandbox="bwrap", language="bash")
    assert "bash" in planted.agent_output and "cat" in planted.agent_output, planted.agent_output
    assert (planted.status, planted.reward, planted.error_kind) == ("failed", 0.0, "tests_failed"), (
        planted.error, planted.log[-3000:])  # fmt: skip
    suspicious = planted.system_changes["suspicious"]
    assert "/app/bin/bash" in suspicious and "/app/bin/cat" in suspicious, planted.system_changes
    assert not any(path.startswith("/app") for path in planted.system_changes["paths"])  # still its own folder

    honest = evaluate(url, "echo 42 > /app/answer.txt\n", config=config, sandbox="bwrap", language="bash")
    assert (honest.status, honest.reward) == ("completed", 1.0), (honest.error, honest.log[-3000:])


def test_what_an_agent_plants_on_a_path_folder_in_its_working_directory_is_named_without_isolation(
    tasks, config, base_image, base_layer
):
    """Without ``isolated`` the verifier runs on what the agent left, as its authors meant; the record
    says what the agent put where the verifier looks for its commands."""
    ref = image(base_image, base_layer, "path-in-workdir", [f"PATH=/app/bin:{SYSTEM_PATH}"])
    planted = evaluate(harbor_task(tasks, ref, ANSWER_TEST, isolated=False), PLANT_ON_PATH, config=config,
                       sandbox="bwrap", language="bash")  # fmt: skip
    suspicious = planted.system_changes["suspicious"]
    assert "/app/bin/bash" in suspicious and "/app/bin/cat" in suspicious, planted.system_changes


VENV_AGENT = """\
import os, shutil, sys
print("AGENT python", sys.executable, sys.prefix)
print("AGENT which", shutil.which("python3"))
print("AGENT VIRTUAL_ENV", os.environ.get("VIRTUAL_ENV", "none"))
print("AGENT PATH", os.environ["PATH"])
hook = "open('/logs/verifier/reward.txt', 'w').write('1')\\n"
session = os.path.dirname(os.environ["HOME"])
for venv in {os.environ.get("VIRTUAL_ENV") or session + "/venv", session + "/venv"}:
    folder = f"{venv}/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    try:
        os.makedirs(folder, exist_ok=True)
        with open(folder + "/sitecustomize.py", "w") as handle:
            handle.write(hook)
        print("planted", folder)
    except OSError as exc:
        print("could not plant", folder, exc)
"""
VENV_TEST = b"""\
#!/bin/bash
echo 0 > /logs/verifier/reward.txt
echo "VERIFIER PATH=$PATH"
echo "VERIFIER VIRTUAL_ENV=${VIRTUAL_ENV:-none}"
echo "VERIFIER python3=$(command -v python3) prefix=$(python3 -c 'import sys; print(sys.prefix)')"
"""


def test_an_image_task_runs_with_the_images_python_and_no_venv_of_the_executor(tasks, config, base_image, base_layer):
    ref = image(base_image, base_layer, "plain-app", [f"PATH={SYSTEM_PATH}"])
    evaluation = evaluate(harbor_task(tasks, ref, VENV_TEST, isolated=False), VENV_AGENT, config=config,
                          sandbox="bwrap", language="python")  # fmt: skip
    agent, tests = evaluation.agent_output, evaluation.test_output
    assert f"AGENT PATH {SYSTEM_PATH}\n" in agent, agent  # the image's PATH, nothing of the session
    assert "AGENT which /usr/bin/python3\n" in agent and "AGENT VIRTUAL_ENV none\n" in agent, agent
    assert "AGENT python /usr/bin/python3 /usr\n" in agent, agent  # the agent itself runs on the image's python3
    assert f"VERIFIER PATH={SYSTEM_PATH}\n" in tests, tests
    assert "VERIFIER VIRTUAL_ENV=none\n" in tests and "VERIFIER python3=/usr/bin/python3 prefix=/usr\n" in tests, tests
    assert (evaluation.status, evaluation.reward) == ("failed", 0.0), (evaluation.error, evaluation.log[-3000:])
