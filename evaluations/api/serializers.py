"""Validation of POST /evaluate: serializers own the rules, views stay thin.

The limits come from the executor's Config in the serializer's context (``{"config": ...}``),
which the caller passes: the API view its settings, ``manage.py evaluate`` its own run's.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from urllib.parse import urlsplit

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

import assets
from evaluations import agents, languages
from evaluations.network.urlguard import MAX_URL_CHARS
from executor_project.config import Config

ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# Set by the executor for every agent run; a submission may not replace them.
RESERVED_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "TZ",
        "PYTHONHASHSEED",
        "TASK_PROMPT",
        "REPO_DIR",
        "TASK_ID",
        "TASK_STEP",  # SPEC §23: a task of [[steps]]'s step, the executor's to set
        "STATIC_ASSETS_DIR",
    }
)
RESERVED_ENV_PREFIXES = ("STATIC_ASSET_", "TERM_EXECUTOR_", "LD_")
MAX_ENV_NAMES = 64
MAX_ENV_BYTES = 64 * 1024
MAX_METADATA_BYTES = 4 * 1024


def _check_url(value: str, allowed_schemes: tuple[str, ...]) -> str:
    if len(value) > MAX_URL_CHARS:
        raise serializers.ValidationError(f"must be at most {MAX_URL_CHARS} characters")
    parts = urlsplit(value)
    if parts.scheme.lower() not in allowed_schemes:
        raise serializers.ValidationError(f"scheme must be one of {', '.join(allowed_schemes)}")
    if parts.scheme.lower() != "file" and not parts.hostname:
        raise serializers.ValidationError("must name a host")
    return value


class StrictCharField(serializers.CharField):
    """A CharField that refuses numbers and booleans instead of turning them into strings."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


# -- how the request fields are documented ---------------------------------------------------
# The rules below word their own errors (validate_<field>), so the fields carry no DRF limit;
# each field class says what the OpenAPI document (GET /api/schema) shows instead,
# which is also what schema generators (schemathesis) produce: http(s) URLs with a host, the
# host's languages, a timeout of at least 1.

HTTP_URL = r"^https?://[A-Za-z0-9][A-Za-z0-9.-]{0,62}(:[0-9]{1,5})?(/[!-~]*)?$"


class AssetSpecSerializer(serializers.Serializer):
    # One of static_assets' values, as documented; assets.resolve validates them.
    path = serializers.CharField(help_text="Relative to STATIC_ASSETS_ROOT.")
    save_path = serializers.CharField(required=False, help_text="Where it appears in the workspace; default `path`.")


@extend_schema_field(serializers.ChoiceField(choices=list(languages.available())))
class LanguageField(StrictCharField):
    pass


HTTP_URL_SCHEMA = {"type": "string", "maxLength": MAX_URL_CHARS, "pattern": HTTP_URL}


@extend_schema_field(HTTP_URL_SCHEMA)
class TaskUrlField(StrictCharField):
    pass


@extend_schema_field({"type": "array", "items": HTTP_URL_SCHEMA, "minItems": 1})
class TaskUrlListField(serializers.ListField):
    pass


@extend_schema_field({"oneOf": [HTTP_URL_SCHEMA, {"type": "string", "maxLength": 0}]})
class CallbackUrlField(StrictCharField):
    """Optional; "" (the default) is no callback."""

    def __init__(self, **kwargs):
        super().__init__(required=False, allow_blank=True, default="", trim_whitespace=False, **kwargs)


@extend_schema_field(serializers.IntegerField(min_value=1))
class TimeoutField(StrictIntegerField):
    pass


@extend_schema_field(serializers.IntegerField(min_value=1))
class AttemptsField(StrictIntegerField):
    pass


@extend_schema_field(serializers.DictField(child=AssetSpecSerializer()))
class StaticAssetsField(serializers.DictField):
    pass


class AgentSourceSerializer(serializers.Serializer):
    """The agent of a request (SPEC §14), shared by POST /evaluate and POST /batches.

    Exactly one of ``agent_code`` (one source file) and ``agent_archive`` (base64 of a .tar.gz
    or .zip project). validated_data holds the archive's decoded bytes under ``agent_archive``;
    ``evaluations.agents.model_fields`` turns it into the row's fields.
    """

    agent_code = StrictCharField(
        trim_whitespace=False,
        allow_blank=False,
        required=False,
        help_text="The agent's source, one file; at most MAX_AGENT_CODE_BYTES UTF-8 bytes. "
        "Exactly one of agent_code and agent_archive.",
    )
    agent_archive = StrictCharField(
        trim_whitespace=False,
        allow_blank=False,
        required=False,
        help_text="Base64 of a .tar.gz or .zip agent project (at most MAX_AGENT_ARCHIVE_BYTES decoded): "
        "the root or a single top folder holds the entry point and an optional requirements.txt "
        "(python) or package.json (node), installed in the step installing_agent.",
    )
    agent_entrypoint = StrictCharField(
        trim_whitespace=False,
        allow_blank=False,
        required=False,
        help_text="With agent_archive: the entry point's relative path in the project root (the archive's "
        "root, or its single top folder); by default agent.py or main.py (python), agent.sh (bash), "
        "agent.js or index.js (node).",
    )
    agent_language = LanguageField(
        required=False, default="python", help_text="One of GET /status `languages`: the interpreters this host has."
    )

    @property
    def config(self) -> Config:
        return self.context["config"]

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["the body must be a JSON object"]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: ["unknown field"] for name in unknown})
        given = [name for name in ("agent_code", "agent_archive") if data.get(name) is not None]
        if len(given) != 1:
            problem = "both were given" if given else "neither was given"
            message = f"exactly one of agent_code and agent_archive is required; {problem}"
            raise serializers.ValidationError({name: [message] for name in ("agent_code", "agent_archive")})
        if "agent_entrypoint" in data and "agent_archive" not in data:
            raise serializers.ValidationError({"agent_entrypoint": ["only applies to agent_archive"]})
        return super().to_internal_value(data)

    def validate_agent_code(self, value: str) -> str:
        limit = self.config.max_agent_code_bytes
        size = len(value.encode("utf-8", errors="surrogatepass"))
        if size > limit:
            raise serializers.ValidationError(f"is {size} bytes; at most {limit} UTF-8 bytes are allowed")
        if "\x00" in value:
            raise serializers.ValidationError("must not contain NUL characters")
        return value

    def validate_agent_archive(self, value: str) -> bytes:
        limit = self.config.max_agent_archive_bytes
        if len(value) > 4 * (limit // 3 + 1):
            raise serializers.ValidationError(f"is over {limit} bytes once decoded; at most {limit} are allowed")
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise serializers.ValidationError("is not valid base64") from None
        if len(data) > limit:
            raise serializers.ValidationError(f"is {len(data)} bytes once decoded; at most {limit} are allowed")
        return data

    def validate_agent_language(self, value: str) -> str:
        known = languages.available()
        if value not in known:
            raise serializers.ValidationError(f"unknown language {value!r}; one of {', '.join(known)}")
        return value

    def validate(self, attrs):
        """An archive is extracted as it will be to run (agents.check): refused now, not in the worker.

        ``agent_entrypoint`` becomes the entry point found, relative to the project root.
        """
        attrs = super().validate(attrs)
        data = attrs.get("agent_archive")
        if data is not None:
            try:
                attrs["agent_entrypoint"] = agents.check(
                    data,
                    language=attrs.get("agent_language", "python"),
                    entrypoint=attrs.get("agent_entrypoint", ""),
                    config=self.config,
                )
            except agents.ProjectError as exc:
                raise serializers.ValidationError({exc.field: [str(exc)]}) from None
        return attrs


def check_task_url(value: str, config: Config) -> str:
    """POST /evaluate's task_url rule, which each of POST /batches' task_urls follows."""
    schemes = ("http", "https", "file") if config.allow_file_urls else ("http", "https")
    return _check_url(value, schemes)


class SubmissionSerializer(AgentSourceSerializer):
    """What POST /evaluate and POST /batches share besides the agent: the run's options."""

    timeout_secs = TimeoutField(
        required=False, allow_null=True, default=None, help_text="Agent timeout, 1 to AGENT_TIMEOUT_SECS."
    )
    env = serializers.DictField(
        child=StrictCharField(allow_blank=True, trim_whitespace=False),
        required=False,
        help_text="Agent environment: at most 64 names [A-Z_][A-Z0-9_]*, 64 KiB; reserved names are refused.",
    )
    callback_url = CallbackUrlField(help_text="POSTed the final evaluation, or batch.")  # each request says which
    metadata = serializers.DictField(required=False, allow_null=True, help_text="At most 4 KiB; echoed back.")

    def validate_callback_url(self, value: str) -> str:
        return _check_url(value, ("http", "https")) if value else value

    def validate_timeout_secs(self, value):
        maximum = self.config.agent_timeout_secs
        if value is not None and not 1 <= value <= maximum:
            raise serializers.ValidationError(f"must be between 1 and {maximum}")
        return value

    def validate_env(self, value: dict) -> dict:
        if len(value) > MAX_ENV_NAMES:
            raise serializers.ValidationError(f"at most {MAX_ENV_NAMES} names are allowed")
        problems = []
        for name in sorted(value):
            if not ENV_NAME.match(name):
                problems.append(f"{name!r} is not a valid name ([A-Z_][A-Z0-9_]*)")
            elif name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
                problems.append(f"{name!r} is reserved by the executor")
            elif "\x00" in value[name]:
                problems.append(f"{name!r} has a NUL character in its value")
        if problems:
            raise serializers.ValidationError(problems)
        size = sum(len(k.encode()) + len(v.encode()) for k, v in value.items())
        if size > MAX_ENV_BYTES:
            raise serializers.ValidationError(f"is {size} bytes; at most {MAX_ENV_BYTES} are allowed")
        return value

    def validate_metadata(self, value):
        if value is not None and len(json.dumps(value).encode()) > MAX_METADATA_BYTES:
            raise serializers.ValidationError(f"must be at most {MAX_METADATA_BYTES} bytes as JSON")
        return value


def submission_fields(data: dict) -> dict:
    """The row columns POST /evaluate, POST /batches and manage.py evaluate fill alike from a
    SubmissionSerializer's validated data (or _plain_request's): the agent and the run's options."""
    return {
        **agents.model_fields(data),
        "language": data["agent_language"],
        "timeout_secs": data.get("timeout_secs"),
        "env": data.get("env") or {},
        "callback_url": data.get("callback_url") or "",
        "metadata": data.get("metadata"),
    }


class EvaluateRequestSerializer(SubmissionSerializer):
    """POST /evaluate's body."""

    task_url = TaskUrlField(
        trim_whitespace=False, help_text="http(s) URL of the task archive (file:// only with ALLOW_FILE_URLS)."
    )
    static_assets = StaticAssetsField(required=False, allow_null=True)
    callback_url = CallbackUrlField(help_text="POSTed the final evaluation.")

    def validate_task_url(self, value: str) -> str:
        return check_task_url(value, self.config)

    def validate_static_assets(self, value):
        """Checked against STATIC_ASSETS_ROOT and the executor's group now, and again when it runs."""
        if not value:
            return value
        config = self.config
        try:
            submitted = assets.resolve(
                value, config.static_assets_root, base_label="STATIC_ASSETS_ROOT", origin="submission"
            )
            assets.merge({asset.name: asset for asset in config.static_assets}, submitted)
        except assets.AssetError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value


class BatchRequestSerializer(SubmissionSerializer):
    """POST /batches (SPEC §14, §17): one agent, distinct task URLs, each run ``attempts`` times.

    One bad URL refuses the whole batch; the error names its index (``task_urls[3]: ...``).
    MAX_BATCH_TASKS bounds the evaluations admitted, task URLs x attempts: the work a batch
    holds, whichever way it is asked for.
    """

    task_urls = TaskUrlListField(
        child=serializers.JSONField(),
        allow_empty=True,
        help_text="1 to MAX_BATCH_TASKS distinct task URLs, each as POST /evaluate's task_url; one bad URL "
        "refuses the whole batch. Their evaluations queue in this order.",
    )
    attempts = AttemptsField(
        required=False,
        default=1,
        help_text="How many times each task URL runs (pass@k), 1 to MAX_ATTEMPTS (default 10); task URLs x "
        "attempts is at most MAX_BATCH_TASKS. The first attempt of every task queues before any second one.",
    )
    callback_url = CallbackUrlField(
        help_text="POSTed the batch object (GET /batches/{batch_id}) once, when the batch ends."
    )

    def validate_task_urls(self, value: list) -> list[str]:
        limit = self.config.max_batch_tasks
        if not value:
            raise serializers.ValidationError("must name at least one task URL")
        if len(value) > limit:
            raise serializers.ValidationError(f"has {len(value)} task URLs; at most {limit} are allowed")
        seen: dict[str, int] = {}
        for i, url in enumerate(value):
            where = f"task_urls[{i}]"
            if not isinstance(url, str) or not url or "\x00" in url:
                raise serializers.ValidationError(f"{where}: must be a non-empty string")
            try:
                check_task_url(url, self.config)
            except serializers.ValidationError as exc:
                raise serializers.ValidationError(f"{where}: {' '.join(map(str, exc.detail))}") from None
            if url in seen:
                raise serializers.ValidationError(f"{where}: the same URL as task_urls[{seen[url]}]")
            seen[url] = i
        return value

    def validate_attempts(self, value: int) -> int:
        maximum = self.config.max_attempts
        if not 1 <= value <= maximum:
            raise serializers.ValidationError(f"must be between 1 and {maximum} (MAX_ATTEMPTS)")
        return value

    def validate(self, attrs):
        """Task URLs x attempts within MAX_BATCH_TASKS, before the agent's archive is extracted."""
        limit, runs = self.config.max_batch_tasks, len(attrs["task_urls"]) * attrs["attempts"]
        if runs > limit:
            raise serializers.ValidationError(
                {
                    "attempts": [
                        f"{len(attrs['task_urls'])} task URLs x {attrs['attempts']} attempts is {runs} evaluations; "
                        f"at most {limit} (MAX_BATCH_TASKS) are allowed"
                    ]
                }
            )
        return super().validate(attrs)


# -- the fast path -----------------------------------------------------------------------------
# DRF builds a serializer's fields anew for every instance (a deepcopy of each declared field),
# and runs each through its validators: more CPU than the rest of a refused POST, enough to
# miss bench/run's target for refusals (bench/RESULTS.md, issue 13). A plain request
# (every value of the type its field expects, nothing DRF would reject or change) is checked
# here against the same rules, the serializer's validate_<field> methods; anything else,
# and any rule that fails, goes through the serializer, which decides and words the error.

_FIELD_NAMES = frozenset(EvaluateRequestSerializer().fields)  # built once: the fields a plain request may name
_ARCHIVE_FIELDS = frozenset({"agent_archive", "agent_entrypoint"})


def _is_text(value) -> bool:
    """A str that DRF's CharField keeps as it is: no NUL character, no lone surrogate."""
    if type(value) is not str or "\x00" in value:
        return False
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
    return True


def _plain_request(data, config: Config) -> dict | None:
    """The serializer's validated_data for a plain, valid request; None for any other."""
    if type(data) is not dict or not _FIELD_NAMES.issuperset(data) or not _ARCHIVE_FIELDS.isdisjoint(data):
        return None  # an archive agent goes through the serializer, which checks the archive
    agent_code, task_url = data.get("agent_code"), data.get("task_url")
    language, callback_url = data.get("agent_language", "python"), data.get("callback_url", "")
    timeout_secs = data.get("timeout_secs")
    if not (_is_text(agent_code) and agent_code and _is_text(task_url) and task_url):
        return None
    if not (_is_text(language) and language and language.strip() == language and _is_text(callback_url)):
        return None  # agent_language is trimmed by DRF: leave any whitespace to it
    if timeout_secs is not None and type(timeout_secs) is not int:
        return None
    env = data.get("env", {})
    if type(env) is not dict or not all(_is_text(value) for value in env.values()):
        return None
    for name in ("static_assets", "metadata"):
        if data.get(name) is not None and type(data[name]) is not dict:
            return None
    rules = EvaluateRequestSerializer(context={"config": config})  # only its validate_<field> methods run
    try:
        validated = {
            "agent_code": rules.validate_agent_code(agent_code),
            "agent_language": rules.validate_agent_language(language),
            "task_url": rules.validate_task_url(task_url),
            "timeout_secs": rules.validate_timeout_secs(timeout_secs),
            "callback_url": rules.validate_callback_url(callback_url),
        }
        if "env" in data:
            validated["env"] = rules.validate_env(dict(env))
        for name in ("static_assets", "metadata"):
            if name in data:
                value = data[name]
                validated[name] = getattr(rules, f"validate_{name}")(None if value is None else dict(value))
    except serializers.ValidationError:
        return None
    return validated


def validate_evaluate_request(data, config: Config) -> dict:
    """POST /evaluate's body, validated: EvaluateRequestSerializer's validated_data, or its ValidationError."""
    validated = _plain_request(data, config)
    if validated is None:
        serializer = EvaluateRequestSerializer(data=data, context={"config": config})
        serializer.is_valid(raise_exception=True)
        validated = serializer.validated_data
    return validated
