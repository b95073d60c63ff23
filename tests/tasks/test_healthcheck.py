"""SPEC §23 as task.toml states it: ``[environment.healthcheck]`` read as Harbor 0.25's ``HealthcheckConfig``
(its defaults, every bad value refused naming its key), and the environment's first process as Harbor's
docker backend starts its main container (the image's ENTRYPOINT, the compose service's ``command`` or
Harbor's ``sh -c "sleep infinity"``)."""

from __future__ import annotations

import pytest

from evaluations.pipeline.context import StepFailed
from evaluations.pipeline.services import first_process
from evaluations.tasks.registry import load_task
from evaluations.tasks.spec import FirstProcess, Healthcheck
from tests.tasks.test_formats import error, harbor

SLEEP = ("sh", "-c", "sleep infinity")


def test_harbors_defaults(tmp_path):
    spec = load_task(harbor(tmp_path, '[environment.healthcheck]\ncommand = "curl -sf localhost"\n'))
    assert spec.healthcheck == Healthcheck(command="curl -sf localhost")
    assert (spec.healthcheck.interval_sec, spec.healthcheck.timeout_sec, spec.healthcheck.start_period_sec,
            spec.healthcheck.start_interval_sec, spec.healthcheck.retries) == (5.0, 30.0, 0.0, 5.0, 3)  # fmt: skip
    assert spec.first_process == FirstProcess(command=SLEEP)
    assert load_task(harbor(tmp_path / "none", "")).healthcheck is None


def test_every_key_is_read(tmp_path):
    toml = (
        '[environment.healthcheck]\ncommand = "test -e /ready"\ninterval_sec = 0.5\ntimeout_sec = 2\n'
        "start_period_sec = 0\nstart_interval_sec = 1\nretries = 7\nextra = 1\n"
    )
    spec = load_task(harbor(tmp_path, toml))
    assert spec.healthcheck == Healthcheck("test -e /ready", 0.5, 2.0, 0.0, 1.0, 7)
    assert spec.metadata == {"environment": {"healthcheck": {"extra": 1}}}  # kept, as every unread key


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("retries = 3\n", "task.toml: [environment.healthcheck] command must be a non-empty command"),
        ('command = "  "\n', "task.toml: [environment.healthcheck] command must be a non-empty command"),
        ("command = 1\n", "task.toml: [environment.healthcheck] command must be a string, got a number"),
        ('command = "a\\u0000b"\n', "task.toml: [environment.healthcheck] command must not contain a NUL character"),
        ('command = "x"\ninterval_sec = 0\n', "[environment.healthcheck] interval_sec must be a positive number, got 0"),
        ('command = "x"\ntimeout_sec = -1\n', "[environment.healthcheck] timeout_sec must be a positive number, got -1"),
        ('command = "x"\nstart_interval_sec = "5s"\n',
         "[environment.healthcheck] start_interval_sec must be a positive number, got a string"),
        ('command = "x"\nstart_period_sec = -0.5\n',
         "[environment.healthcheck] start_period_sec must be a number of seconds, 0 or more, got -0.5"),
        ('command = "x"\nstart_period_sec = true\n',
         "[environment.healthcheck] start_period_sec must be a number of seconds, 0 or more, got a boolean"),
        ('command = "x"\nretries = 0\n',
         "[environment.healthcheck] retries must be a positive whole number, got 0"),
        ('command = "x"\nretries = 2.5\n',
         "[environment.healthcheck] retries must be a positive whole number, got 2.5"),
        ('command = "x"\ninterval_sec = inf\n',
         "[environment.healthcheck] interval_sec must be a positive number, got inf"),
    ],
)  # fmt: skip
def test_a_bad_value_is_named(tmp_path, table, message):
    assert message in error(harbor(tmp_path, "[environment.healthcheck]\n" + table))


def test_a_healthcheck_that_is_no_table_is_named(tmp_path):
    message = error(harbor(tmp_path, '[environment]\nhealthcheck = "curl x"\n'))
    assert message == "task.toml: [environment.healthcheck] must be a table, got a string"


def test_the_compose_services_command_and_entrypoint(tmp_path):
    compose = "services:\n  main:\n    entrypoint: /start.sh --quiet\n    command: ['serve', '--port', '80']\n"
    spec = load_task(harbor(tmp_path, "", **{"environment/docker-compose.yaml": compose}))
    assert spec.first_process == FirstProcess(entrypoint=("/start.sh", "--quiet"), command=("serve", "--port", "80"))
    bad = "services:\n  main:\n    command: {run: x}\n"
    message = error(harbor(tmp_path / "bad", "", **{"environment/docker-compose.yaml": bad}))
    assert (
        message
        == "environment/docker-compose.yaml: service 'main': 'command' must be a string or a list of strings, got dict"
    )
    unsplittable = 'services:\n  main:\n    entrypoint: "sh -c \'x"\n'
    message = error(harbor(tmp_path / "quote", "", **{"environment/docker-compose.yaml": unsplittable}))
    assert message.startswith("environment/docker-compose.yaml: service 'main': 'entrypoint' \"sh -c 'x\" cannot be")


@pytest.mark.parametrize(
    ("config", "start", "argv"),
    [
        # Harbor's default: the image's CMD never runs; with no ENTRYPOINT nothing does (sleep infinity only
        # keeps a container alive), whatever the CMD (a shell, a server).
        ({"Cmd": ["bash"]}, FirstProcess(command=SLEEP), None),
        ({"Cmd": ["python3", "-m", "http.server"]}, FirstProcess(command=SLEEP), None),
        ({}, FirstProcess(command=SLEEP), None),
        # An ENTRYPOINT runs, given Harbor's command as its arguments (an entrypoint script's "$@").
        ({"Entrypoint": ["/entry.sh"], "Cmd": ["bash"]}, FirstProcess(command=SLEEP), ["/entry.sh", *SLEEP]),
        # The compose service's command replaces Harbor's; its entrypoint the image's.
        ({"Cmd": ["bash"]}, FirstProcess(command=("python3", "serve.py")), ["python3", "serve.py"]),
        ({"Entrypoint": ["/entry.sh"]}, FirstProcess(entrypoint=("/other",), command=SLEEP), ["/other", *SLEEP]),
        ({"Entrypoint": ["/entry.sh"]}, FirstProcess(entrypoint=(), command=("tail", "-f", "/dev/null")), None),
        # As Docker joins them when nothing overrides: a compose entrypoint drops the image's CMD.
        ({"Entrypoint": ["/e"], "Cmd": ["a"]}, FirstProcess(), ["/e", "a"]),
        ({"Entrypoint": ["/e"], "Cmd": ["a"]}, FirstProcess(entrypoint=("/f",)), ["/f"]),
        ({"Cmd": ["bash"]}, FirstProcess(), None),
    ],
)
def test_the_first_process_as_docker_joins_it(config, start, argv):
    assert first_process(config, start) == argv


def test_an_image_config_that_is_no_list_is_refused():
    with pytest.raises(StepFailed, match="the image's Entrypoint must be a list of strings"):
        first_process({"Entrypoint": "/entry.sh"}, FirstProcess(command=SLEEP))
