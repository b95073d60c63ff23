"""Logging: one line per event; LOG_FORMAT=json for machine-readable lines."""

from __future__ import annotations

import json
import logging
import time

from executor_project.config import Config


class JsonFormatter(logging.Formatter):
    """One JSON object a line, with eval_id whenever the record carries one."""

    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
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
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        eval_id = getattr(record, "eval_id", None)
        return f"{line} eval_id={eval_id}" if eval_id else line


def logging_config(config: Config) -> dict:
    formatter = "json" if config.log_format == "json" else "text"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "json": {"()": JsonFormatter},
            "text": {"()": TextFormatter, "format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        },
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": formatter}},
        "root": {"handlers": ["stderr"], "level": config.log_level},
        "loggers": {"django": {"level": "WARNING"}, "term_executor": {"level": config.log_level}},
    }
