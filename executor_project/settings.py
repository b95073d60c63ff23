"""Django settings. Every executor setting comes from executor_project.config."""

from __future__ import annotations

import sys

from evaluations.api.limits import max_body_bytes
from executor_project import config as config_module
from executor_project import settings_loader
from executor_project.dburl import parse_database_url
from executor_project.logs import logging_config
from executor_project.memory import without_postgresql_drivers

try:
    EXECUTOR = settings_loader.load()
    _database = parse_database_url(EXECUTOR.database_url, EXECUTOR.data_dir / "executor.sqlite3")
except config_module.ConfigError as exc:
    # One line naming the variable, no traceback: this is an operator's mistake.
    sys.stderr.write(f"term-executor: configuration error: {exc}\n")
    sys.exit(2)
without_postgresql_drivers(_database)  # before anything imports DRF

BASE_DIR = config_module.PROJECT_DIR
EXECUTOR.data_dir.mkdir(parents=True, exist_ok=True)
config_module.close_to_others(EXECUTOR.data_dir)  # the database, secret key, sockets: ours only

SECRET_KEY = config_module.django_secret_key(EXECUTOR)
DEBUG = False
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served by us: /api/docs works offline
    "django_prometheus",
    "evaluations",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Django's session, CSRF, auth and messages middleware, passed by for the token API (middleware.py).
    "executor_project.middleware.AdminSessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "executor_project.middleware.AdminCsrfViewMiddleware",
    "executor_project.middleware.AdminAuthenticationMiddleware",
    "executor_project.middleware.AdminMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "executor_project.prometheus.PrometheusAfterMiddleware",  # django-prometheus', its series kept
]

ROOT_URLCONF = "executor_project.urls"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "executor_project.wsgi.application"

DATABASES = {"default": _database}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = EXECUTOR.data_dir / "staticfiles"

REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["evaluations.api.parsers.BoundedJSONParser"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "evaluations.api.negotiation.ContentNegotiation",
    "DEFAULT_AUTHENTICATION_CLASSES": ["evaluations.api.auth.BearerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["evaluations.api.auth.TokenRequired"],
    "EXCEPTION_HANDLER": "evaluations.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

# GET /api/schema and /api/docs (each view describes its route; evaluations/api/openapi.py the rest).
SPECTACULAR_SETTINGS = {
    "TITLE": "term-executor",
    "DESCRIPTION": "Remote evaluation executor: submit agent code and a task archive URL, "
    "follow the evaluation, read which tests passed. Errors are `{error, detail[, fields]}`.",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_AUTHENTICATION": [],  # the document is public, like /health
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"validatorUrl": None, "persistAuthorization": True},  # no call to a remote validator
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "EvaluationStatusEnum": "evaluations.models.Status",
        "HealthStatusEnum": ["ok"],
        "UnhealthyStatusEnum": ["unhealthy"],
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "evaluations.api.openapi.postprocess",
    ],
}

LOGGING = logging_config(EXECUTOR)

# Django's own body cap matches the API's (evaluations/api/limits.py).
DATA_UPLOAD_MAX_MEMORY_SIZE = max_body_bytes(EXECUTOR)
