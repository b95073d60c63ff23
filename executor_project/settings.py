"""Django settings. Every executor setting comes from executor_project.config."""

from __future__ import annotations

import sys

from executor_project import config as config_module
from executor_project.dburl import parse_database_url
from executor_project.logs import logging_config

try:
    EXECUTOR = config_module.load()
    _database = parse_database_url(EXECUTOR.database_url, EXECUTOR.data_dir / "executor.sqlite3")
except config_module.ConfigError as exc:
    # One line naming the variable, no traceback: this is an operator's mistake.
    sys.stderr.write(f"term-executor: configuration error: {exc}\n")
    sys.exit(2)

BASE_DIR = config_module.PROJECT_DIR
EXECUTOR.data_dir.mkdir(parents=True, exist_ok=True)

SECRET_KEY = config_module.secret_key(EXECUTOR)
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
    "django_prometheus",
    "evaluations",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
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
    "DEFAULT_AUTHENTICATION_CLASSES": ["evaluations.api.auth.BearerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["evaluations.api.auth.TokenRequired"],
    "EXCEPTION_HANDLER": "evaluations.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}

LOGGING = logging_config(EXECUTOR)

# Django's own body cap matches the API's (a JSON-escaped agent_code may be 6x its bytes).
DATA_UPLOAD_MAX_MEMORY_SIZE = EXECUTOR.max_agent_code_bytes * 6 + 1024 * 1024
