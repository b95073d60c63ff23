"""One line per event; LOG_FORMAT=json; the eval_id on every line logged while an evaluation runs."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import logging.config
import threading

import pytest

from executor_project.config import Config
from executor_project.logs import evaluation_context, logging_config


@pytest.fixture
def capture():
    """Configure logging as settings.py does, into a buffer; give back (format) -> buffer."""
    saved = logging.root.handlers[:], logging.root.level
    stream = io.StringIO()

    def configure(log_format: str) -> io.StringIO:
        config = logging_config(dataclasses.replace(Config(), log_format=log_format))
        config["handlers"]["stderr"]["stream"] = stream
        logging.config.dictConfig(config)
        return stream

    yield configure
    logging.root.handlers[:], level = saved
    logging.root.setLevel(level)


def log_an_evaluation():
    logging.getLogger("term_executor.worker").info("outside any evaluation")
    with evaluation_context("e-1"):
        logging.getLogger("evaluations.runtime.spawner").info("eval e-1: killing pid 7:\nmemory limit")
        # The spawner's monitor and readers are threads of their own.
        thread = threading.Thread(target=lambda: logging.getLogger("evaluations.runtime.monitor").warning("sample"))
        thread.start()
        thread.join()
        logging.getLogger("term_executor.worker").info("claimed", extra={"eval_id": "e-2"})  # its own id wins
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("term_executor.pipeline").exception("internal error in running_agent")
    logging.getLogger("term_executor.worker").info("after it")


def test_json_lines_carry_the_eval_id_whoever_logs(capture):
    stream = capture("json")
    log_an_evaluation()
    lines = stream.getvalue().splitlines()
    events = [json.loads(line) for line in lines]  # one JSON object a line, tracebacks included
    assert [e.get("eval_id") for e in events] == [None, "e-1", "e-1", "e-2", "e-1", None]
    assert events[1] == {**events[1], "level": "info", "logger": "evaluations.runtime.spawner"}
    assert events[1]["msg"] == "eval e-1: killing pid 7:\nmemory limit"
    assert "ValueError: boom" in events[4]["exc"] and events[4]["ts"].endswith("Z")


def test_text_lines_are_one_per_event_too(capture):
    stream = capture("text")
    log_an_evaluation()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 6
    assert lines[1].endswith("INFO evaluations.runtime.spawner: eval e-1: killing pid 7:\\nmemory limit eval_id=e-1")
    assert "eval_id=e-1 exc=" in lines[4] and "ValueError: boom" in lines[4]
    assert "eval_id" not in lines[0] and "eval_id" not in lines[5]


def test_gunicorn_logs_through_the_same_handler():
    config = logging_config(dataclasses.replace(Config(), log_format="json"))
    for name in ("gunicorn.error", "gunicorn.access"):
        assert config["loggers"][name]["handlers"] == ["stderr"] and config["loggers"][name]["propagate"] is False
    assert config["handlers"]["stderr"]["filters"] == ["eval_id"]


def test_a_response_marked_logged_is_not_logged_again_by_django():
    """A 503 at capacity is logged once a minute by the view; Django's per-response WARNING is
    skipped through the private ``_has_been_logged`` that django.utils.log.log_response reads."""
    from django.test import RequestFactory
    from django.utils.log import log_response

    from evaluations.api.errors import ApiError, exception_handler

    request = RequestFactory().post("/evaluate")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("django.request")
    logger.addHandler(handler)
    try:
        for logged in (False, True):
            records.clear()
            response = exception_handler(ApiError(503, "at_capacity", "full", logged=logged), {})
            log_response("%s: %s", response.reason_phrase, request.path, response=response, request=request)
            assert len(records) == (0 if logged else 1)
    finally:
        logger.removeHandler(handler)
