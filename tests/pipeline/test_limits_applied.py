"""What a Harbor task asks for, capped by the operator's settings (SPEC §17): the smaller wins, and what
was applied is on the evaluation (``limits_applied``) and in the Config the evaluation's commands use."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

from evaluations.models import Evaluation
from evaluations.pipeline import verifier
from evaluations.tasks.registry import load_task


def harbor(tmp_path, toml: str):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (tmp_path / "instruction.md").write_text("Do it.\n")
    (tmp_path / "task.toml").write_text('[environment]\ndocker_image = "debian:bookworm"\n' + toml)
    return load_task(tmp_path)


def applied(settings, tmp_path, toml: str, *, timeout_secs=None, **config):
    """The Config the evaluation's commands get, and what apply_request staged for its row (as a namespace)."""
    evaluation = Evaluation(task_url="http://x/t.tar.gz", agent_code="", timeout_secs=timeout_secs)
    staged = {}
    ctx = SimpleNamespace(
        task=harbor(tmp_path, toml),
        config=dataclasses.replace(settings.EXECUTOR, **config),
        evaluation=evaluation,
        eval_id=str(evaluation.id),
        stage=staged.update,
    )
    verifier.apply_request(ctx)
    return ctx.config, SimpleNamespace(**staged)


def test_the_smaller_of_the_tasks_request_and_the_operators_limit_wins(settings, tmp_path):
    config, evaluation = applied(
        settings, tmp_path,
        "memory_mb = 512\nstorage_mb = 99999\nbuild_timeout_sec = 60\ncpus = 64\n"
        "[agent]\ntimeout_sec = 5000.0\n[verifier]\ntimeout_sec = 30.5\n",
        agent_timeout_secs=600, test_timeout_secs=300, memory_limit_mb=4096, disk_quota_mb=2048,
        build_timeout_secs=1800,
    )  # fmt: skip
    assert (config.agent_timeout_secs, config.test_timeout_secs, config.memory_limit_mb) == (600, 31, 512)
    assert (config.disk_quota_mb, config.build_timeout_secs) == (2048, 60)
    limits = evaluation.limits_applied
    assert limits == {
        "agent_timeout_secs": 600, "verifier_timeout_secs": 31, "build_timeout_secs": 60, "memory_mb": 512,
        "storage_mb": 2048, "cpus": float(os.cpu_count()), "network": "public", "allowed_hosts": None,
        "agent_network": True, "verifier_network": False, "agent_network_mode": "public",
        "agent_allowed_hosts": None, "verifier_network_mode": "public", "verifier_allowed_hosts": None,
    }  # fmt: skip
    assert evaluation.task_format == "harbor"


def test_the_requests_own_timeout_caps_the_tasks_too(settings, tmp_path):
    config, evaluation = applied(settings, tmp_path, "[agent]\ntimeout_sec = 200\n", timeout_secs=90)
    assert config.agent_timeout_secs == 90 and evaluation.limits_applied["agent_timeout_secs"] == 90


def test_no_network_takes_it_from_the_agent_and_the_verifier(settings, tmp_path):
    _, evaluation = applied(settings, tmp_path, 'network_mode = "no-network"\n', test_network=True)
    limits = evaluation.limits_applied
    assert (limits["network"], limits["agent_network"], limits["verifier_network"]) == ("no-network", False, False)


def test_an_operator_without_agent_network_is_not_overruled_by_a_public_task(settings, tmp_path):
    _, evaluation = applied(settings, tmp_path, 'network_mode = "public"\n', agent_network=False)
    assert evaluation.limits_applied["agent_network"] is False


def test_an_allowlist_is_recorded_with_its_hosts(settings, tmp_path):
    _, evaluation = applied(
        settings, tmp_path, 'network_mode = "allowlist"\nallowed_hosts = ["pypi.org", "*.pythonhosted.org"]\n'
    )
    limits = evaluation.limits_applied
    assert limits["allowed_hosts"] == ["pypi.org", "*.pythonhosted.org"]
    assert (limits["agent_network_mode"], limits["verifier_network_mode"]) == ("allowlist", "allowlist")
    assert limits["agent_allowed_hosts"] == limits["verifier_allowed_hosts"] == ["pypi.org", "*.pythonhosted.org"]


def test_each_phase_is_recorded_with_its_own_network(settings, tmp_path):
    """SPEC §23: [agent] and [verifier] override [environment]'s network for their phase; ``network`` and
    ``allowed_hosts`` stay [environment]'s, each phase's is beside them."""
    _, evaluation = applied(
        settings, tmp_path,
        'network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n[agent]\nnetwork_mode = "no-network"\n'
        '[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["::1", "10.0.0.0/8"]\n',
        test_network=True,
    )  # fmt: skip
    limits = evaluation.limits_applied
    assert (limits["network"], limits["allowed_hosts"]) == ("allowlist", ["pypi.org"])
    assert (limits["agent_network_mode"], limits["agent_allowed_hosts"], limits["agent_network"]) == (
        "no-network", None, False)  # fmt: skip
    assert (limits["verifier_network_mode"], limits["verifier_allowed_hosts"], limits["verifier_network"]) == (
        "allowlist", ["::1", "10.0.0.0/8"], True)  # fmt: skip


def test_a_phase_with_network_where_the_environment_has_none(settings, tmp_path):
    _, evaluation = applied(
        settings, tmp_path, 'network_mode = "no-network"\n[verifier]\nnetwork_mode = "public"\n', test_network=True
    )
    limits = evaluation.limits_applied
    assert (limits["network"], limits["agent_network"], limits["verifier_network"]) == ("no-network", False, True)


def test_metadata_is_kept(settings, tmp_path):
    _, evaluation = applied(settings, tmp_path, '[metadata]\ndifficulty = "hard"\n')
    assert evaluation.task_metadata["metadata"] == {"difficulty": "hard"}
