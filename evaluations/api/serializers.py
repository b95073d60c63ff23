"""Validation of POST /evaluate: serializers own the rules, views stay thin."""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

from django.conf import settings
from rest_framework import serializers

import assets
from evaluations import languages

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
        "STATIC_ASSETS_DIR",
    }
)
RESERVED_ENV_PREFIXES = ("STATIC_ASSET_", "TERM_EXECUTOR_", "LD_")
MAX_ENV_NAMES = 64
MAX_ENV_BYTES = 64 * 1024
MAX_METADATA_BYTES = 4 * 1024
MAX_URL_CHARS = 2048


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


class EvaluateRequestSerializer(serializers.Serializer):
    agent_code = StrictCharField(trim_whitespace=False, allow_blank=False)
    agent_language = StrictCharField(required=False, default="python")
    task_url = StrictCharField(trim_whitespace=False)
    timeout_secs = StrictIntegerField(required=False, allow_null=True, default=None)
    env = serializers.DictField(child=StrictCharField(allow_blank=True, trim_whitespace=False), required=False)
    static_assets = serializers.DictField(required=False, allow_null=True)
    callback_url = StrictCharField(required=False, allow_blank=True, default="", trim_whitespace=False)
    metadata = serializers.DictField(required=False, allow_null=True)

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["the body must be a JSON object"]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: ["unknown field"] for name in unknown})
        return super().to_internal_value(data)

    def validate_agent_code(self, value: str) -> str:
        limit = settings.EXECUTOR.max_agent_code_bytes
        size = len(value.encode("utf-8", errors="surrogatepass"))
        if size > limit:
            raise serializers.ValidationError(f"is {size} bytes; at most {limit} UTF-8 bytes are allowed")
        if "\x00" in value:
            raise serializers.ValidationError("must not contain NUL characters")
        return value

    def validate_agent_language(self, value: str) -> str:
        known = languages.available()
        if value not in known:
            raise serializers.ValidationError(f"unknown language {value!r}; one of {', '.join(known)}")
        return value

    def validate_task_url(self, value: str) -> str:
        schemes = ("http", "https", "file") if settings.EXECUTOR.allow_file_urls else ("http", "https")
        return _check_url(value, schemes)

    def validate_callback_url(self, value: str) -> str:
        return _check_url(value, ("http", "https")) if value else value

    def validate_timeout_secs(self, value):
        maximum = settings.EXECUTOR.agent_timeout_secs
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

    def validate_static_assets(self, value):
        """Checked against STATIC_ASSETS_ROOT and the executor's group now, and again when it runs."""
        if not value:
            return value
        config = settings.EXECUTOR
        try:
            submitted = assets.resolve(
                value, config.static_assets_root, base_label="STATIC_ASSETS_ROOT", origin="submission"
            )
            assets.merge({asset.name: asset for asset in config.static_assets}, submitted)
        except assets.AssetError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value
