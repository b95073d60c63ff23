"""POST /evaluate's fast validation path decides exactly as EvaluateRequestSerializer does.

A request the fast path accepts must be one the serializer accepts, with the same
validated data; everything else falls through to the serializer, which words the error.
"""

import itertools
import random

import pytest

from evaluations.api.serializers import EvaluateRequestSerializer, _plain_request, validate_evaluate_request
from executor_project.config import Config

CONFIG = Config()
# Every limit the rules read from the config moved: file URLs allowed, a longer timeout, less code.
LENIENT = Config(allow_file_urls=True, agent_timeout_secs=10**6, max_agent_code_bytes=2000)
GOOD = {"agent_code": "print('hi')", "task_url": "https://example.com/task.tar.gz"}

ODD_VALUES = [
    None, True, 0, 7, -1, 10**9, 1.5, "", " ", "python", " python ", "bash", "cobol", "x\x00y", "\ud800",
    "é ünïcode ✓", "https://example.com/t.tgz", "ftp://example.com/t", "file:///tmp/t.tgz", "http://", "x" * 3000,
    [], ["a"], {}, {"A": "1"}, {"a": "1"}, {"PATH": "/bin"}, {"LD_PRELOAD": "x"}, {"A": 1}, {"A": None},
    {"A": "\x00"}, {"A": "\udfff"}, {"k": [1, 2]}, {"x": "y" * 5000},
]  # fmt: skip
FIELDS = sorted(EvaluateRequestSerializer().fields) + ["unknown"]


def serializer_result(body, config):
    serializer = EvaluateRequestSerializer(data=body, context={"config": config})
    return dict(serializer.validated_data) if serializer.is_valid() else None


def assert_same_decision(body, config=CONFIG):
    fast = _plain_request(body, config)
    slow = serializer_result(body, config)
    if fast is not None:
        assert slow == fast, body
    return fast, slow


@pytest.mark.parametrize(
    "body",
    [
        GOOD,
        {**GOOD, "agent_language": "bash", "timeout_secs": 30, "callback_url": "https://cb.example/x"},
        {**GOOD, "env": {"MY_KEY": "v", "OTHER": ""}, "metadata": {"run": 7, "tags": ["a"]}},
        {**GOOD, "env": {}, "metadata": None, "static_assets": None, "timeout_secs": None, "callback_url": ""},
        {**GOOD, "agent_code": "print('é ✓')\n" * 100},
    ],
)
def test_plain_requests_take_the_fast_path_with_the_serializers_result(body):
    fast, slow = assert_same_decision(body)
    assert fast is not None and fast == slow


@pytest.mark.parametrize("config", [CONFIG, LENIENT], ids=["defaults", "lenient"])
def test_every_odd_value_in_every_field_decides_as_the_serializer(config):
    for field, value in itertools.product(FIELDS, ODD_VALUES):
        assert_same_decision({**GOOD, field: value}, config)
    for field in FIELDS:
        body = dict(GOOD)
        body.pop(field, None)
        assert_same_decision(body, config)
    for body in (None, [], "x", 1, {}, [GOOD]):
        assert _plain_request(body, CONFIG) is None


def test_random_combinations_decide_as_the_serializer():
    rng = random.Random(7)
    for _ in range(3000):
        body = {field: rng.choice(ODD_VALUES) for field in rng.sample(FIELDS, rng.randint(0, 5))}
        if rng.random() < 0.7:
            body = {**GOOD, **body}
        assert_same_decision(body, rng.choice([CONFIG, LENIENT]))


def test_refusals_come_from_the_serializer():
    from rest_framework.exceptions import ValidationError

    with pytest.raises(ValidationError) as caught:
        validate_evaluate_request({**GOOD, "env": {"PATH": "/x"}, "agent_code": ""}, CONFIG)
    assert set(caught.value.detail) == {"env", "agent_code"}


def test_the_fast_path_reads_the_config_it_is_given():
    body = {**GOOD, "task_url": "file:///tmp/t.tgz", "timeout_secs": 700}
    assert _plain_request(body, CONFIG) is None
    fast = _plain_request(body, LENIENT)
    assert fast is not None and fast == serializer_result(body, LENIENT)
    assert _plain_request({**GOOD, "agent_code": "x" * 2001}, LENIENT) is None
