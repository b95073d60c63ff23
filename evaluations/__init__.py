"""term-executor's Django app."""

# The executor's version: GET /status, the OpenAPI document, and every signed result (SPEC §18).
VERSION = "0.1.0"
