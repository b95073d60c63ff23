"""Harbor task.toml keys of SPEC §23 through the whole pipeline, on images pushed to the suite's registry:
``[task] name`` and ``version`` (on the evaluation's ``task_metadata``), ``[environment] docker_image``, ``workdir`` (over the image's WorkingDir, made when the image lacks it) and
``[environment.env]`` (over the image's Env, for the agent and the verifier alike)."""

from __future__ import annotations

import pytest

from tests.helpers import images as images_helpers
from tests.pipeline.test_e2e import evaluate
from tests.pipeline.test_harbor_e2e import harbor_folder, serve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def pushed(base_image, base_layer, name: str, **config) -> str:
    """The suite's Debian tree pushed as ``name`` with ``config`` (Env, WorkingDir, User); its reference."""
    registry, _, _ = base_image
    images_helpers.push_image(registry, name, layers=[base_layer], config={"Cmd": ["bash"], **config})
    return f"{registry.host}/{name}"


SHOW = 'echo "cwd=$(pwd) greeting=$GREETING keep=$KEEP only=${ONLY_TASK:-unset} mode=${MODE:-unset}"\n'
ENV_TEST = (
    "#!/bin/bash\n"
    + SHOW
    + 'test "$(pwd)" = /opt/work && test "$GREETING" = task && test "$KEEP" = image && test "$MODE" = strict '
    '&& test "$(cat answer.txt)" = 42 && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n'
)


def test_workdir_and_the_tasks_env_over_the_images_for_agent_and_verifier(tasks, image_task_config, base_image,
                                                                          base_layer, tmp_path):  # fmt: skip
    image = pushed(base_image, base_layer, "keys/env:1", WorkingDir="/srv",
                   Env=[PATH, "GREETING=image", "KEEP=image"])  # fmt: skip
    toml = (
        'schema_version = "1.4"\n[task]\nname = "suite/keys"\nversion = "0.1.0"\n'
        f'[environment]\ndocker_image = "{image}"\nworkdir = "/opt/work"\n'
        '[environment.env]\nGREETING = "task"\nONLY_TASK = "yes"\n[verifier.env]\nMODE = "strict"\n'
    )
    folder = harbor_folder(tmp_path / "task", toml=toml, test=ENV_TEST)
    evaluation = evaluate(serve(tasks, folder), SHOW + "echo 42 > answer.txt\n", config=image_task_config,
                          sandbox="bwrap", language="bash")  # fmt: skip
    # The agent: in the task's workdir (the image has none there: made, as Docker makes a WORKDIR), the
    # task's GREETING over the image's, the image's KEEP, never the verifier's MODE.
    assert "cwd=/opt/work greeting=task keep=image only=yes mode=unset" in evaluation.agent_output, (
        evaluation.agent_output, evaluation.log[-3000:])  # fmt: skip
    assert "cwd=/opt/work greeting=task keep=image only=yes mode=strict" in evaluation.test_output
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    assert evaluation.environment["kind"] == "image" and evaluation.environment["ref"] == image
    # [task] name and version: on the evaluation with the task's metadata, as task.toml wrote them
    assert evaluation.task_metadata == {"schema_version": "1.4", "task": {"name": "suite/keys", "version": "0.1.0"}}


def test_without_workdir_the_images_working_dir_and_env_stand(tasks, image_task_config, base_image, base_layer,
                                                              tmp_path):  # fmt: skip
    image = pushed(base_image, base_layer, "keys/env:2", WorkingDir="/srv", Env=[PATH, "GREETING=image"])
    test = "#!/bin/bash\n" + SHOW + "echo 1 > /logs/verifier/reward.txt\n"
    folder = harbor_folder(tmp_path / "task", toml=f'[environment]\ndocker_image = "{image}"\n', test=test)
    evaluation = evaluate(serve(tasks, folder), SHOW, config=image_task_config, sandbox="bwrap", language="bash")
    assert "cwd=/srv greeting=image keep= only=unset mode=unset" in evaluation.agent_output, evaluation.agent_output
    assert "cwd=/srv greeting=image" in evaluation.test_output
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
