"""Logging: one line per event; LOG_FORMAT=json for machine-readable lines.

Every line logged while an evaluation runs carries its ``eval_id``:

1. ``run_pipeline`` wraps the evaluation in ``evaluation_context(eval_id)``.
2. ``EvalIdFilter``, on the one handler, stamps the id on every record that
   does not already carry one, whatever logger wrote it (the spawner, the
   killer and the monitor in ``evaluations/runtime`` know nothing of Django
   or of this module).
3. The id is a context variable for the pipeline's own thread and a
   process-wide fallback for the threads the spawner starts (its monitor,
   its readers): an evaluation runs in a process of its own (the worker's
   child, or ``manage.py evaluate``), so the fallback is never ambiguous.

No Django import here: settings.py and gunicorn.conf.py both build the
configuration from this module.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import time

from executor_project.config import Config

_current_eval: contextvars.ContextVar[str | None] = contextvars.ContextVar("term_executor_eval_id", default=None)
_process_eval: str | None = None


@contextlib.contextmanager
def evaluation_context(eval_id):
    """Every log record written inside (in this thread, or any thread of this process) names ``eval_id``."""
    global _process_eval
    token = _current_eval.set(str(eval_id))
    previous, _process_eval = _process_eval, str(eval_id)
    try:
        yield
    finally:
        _current_eval.reset(token)
        _process_eval = previous


def current_eval_id() -> str | None:
    return _current_eval.get() or _process_eval


class EvalIdFilter(logging.Filter):
    """Give a record the eval_id of the evaluation running here, unless it names one itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "eval_id", None):
            eval_id = current_eval_id()
            if eval_id:
                record.eval_id = eval_id
        return True


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object a line, with eval_id whenever the record carries one."""

    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        eval_id = getattr(record, "eval_id", None)
        if eval_id:
            payload["eval_id"] = str(eval_id)
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message> eval_id=<id>``, on one line even with a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {_one_line(record.getMessage())}"
        eval_id = getattr(record, "eval_id", None)
        if eval_id:
            line += f" eval_id={eval_id}"
        if record.exc_info:
            line += " exc=" + json.dumps(self.formatException(record.exc_info), ensure_ascii=False)
        return line


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def logging_config(config: Config) -> dict:
    """Django's LOGGING: every record, ours, Django's and gunicorn's, through one handler and one formatter."""
    formatter = "json" if config.log_format == "json" else "text"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"eval_id": {"()": EvalIdFilter}},
        "formatters": {"json": {"()": JsonFormatter}, "text": {"()": TextFormatter}},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": formatter, "filters": ["eval_id"]},
        },
        "root": {"handlers": ["stderr"], "level": config.log_level},
        "loggers": {
            "django": {"level": "WARNING"},
            "term_executor": {"level": config.log_level},
            # gunicorn's own loggers (used by gunicorn.conf.py's logconfig_dict): same handler, no duplicates.
            "gunicorn.error": {"level": config.log_level, "handlers": ["stderr"], "propagate": False},
            "gunicorn.access": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
        },
    }
