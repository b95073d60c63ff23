"""The rule that splits the suite in two: the tests that touch the database engine are marked
``database`` and run on SQLite and on PostgreSQL; the rest run once, with no database to reach
(.ci/run, README.md).

A test touches the database engine when

- it carries pytest-django's ``django_db`` mark;
- it requests, itself or through its fixtures (``item.fixturenames`` is the whole closure), one of
  ``DATABASE_FIXTURES``: pytest-django's database fixtures all go through ``django_db_setup``, the
  project's start subprocesses on a database of their own (``tests/helpers/service.FreshDatabase``);
- or it is marked ``@pytest.mark.database`` by hand: it reaches a database in a way no fixture shows
  (it builds a ``LiveService`` or an ``EvaluateCli`` itself).

A test the rule misses fails in the run without a database, never passes there: pytest-django refuses
an in-process query of a test without ``django_db``, and DATABASE_URL is ``NO_DATABASE_URL``, a
PostgreSQL server that is not there, which every subprocess (manage.py, gunicorn, run_worker) and
``FreshDatabase`` inherit. tests/test_database_marks.py runs both kinds of accident and sees them fail.
"""

from __future__ import annotations

import pytest

# Nothing listens on port 1: a connection is refused at once, in this process or in any subprocess.
NO_DATABASE_URL = "postgres://no-database@127.0.0.1:1/no_database"

DATABASE_FIXTURES = frozenset(
    {
        "django_db_setup",  # pytest-django's db, transactional_db, live_server, admin_client, ...
        "live_service",  # tests/conftest.py: gunicorn (and run_worker) on a fresh database
        "cli",  # tests/cli/conftest.py, tests/importers/conftest.py: manage.py on a fresh database
        "live_factory",  # tests/security/conftest.py: gunicorn + run_worker on a fresh database
        "sandbox_service",  # tests/sandboxes/conftest.py: the module's service for live sandboxes
        "sandbox_services",  # tests/sandboxes/conftest.py: services of a test's own (lifecycle, fleet)
    }
)


def touches_database(item: pytest.Item) -> bool:
    if item.get_closest_marker("django_db") or item.get_closest_marker("database"):
        return True
    return not DATABASE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if touches_database(item) and not item.get_closest_marker("database"):
            item.add_marker(pytest.mark.database)
