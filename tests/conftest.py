"""Fixtures every test folder shares: the API client, config changes, a real HTTP server, the live
service, and a real Debian environment. Each says what it starts and what it removes after."""

import dataclasses
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from tests.helpers import environments as environment_helpers
from tests.helpers import images as images_helpers
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.service import PROJECT, LiveService

# Marks the tests that touch the database engine (``database``): .ci/run runs the rest once, without one.
pytest_plugins = ("tests.helpers.database_marks",)


@pytest.fixture(autouse=True)
def _project_log_levels():
    """What a test leaves of the project's loggers' levels is undone after it: a command run in the
    test's own process (evaluate, verify_tasks, import_tasks, image) quiets them below -v 2, which
    made tests/ops/test_logging.py fail when it ran after one in the same worker."""
    loggers = [logging.getLogger(name) for name in ("term_executor", "evaluations")]
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        _own_host_folders(worker)


def _own_host_folders(worker: str) -> None:
    """Each pytest-xdist worker is a service of its own on this host: its DATA_DIR and WORKSPACE_BASE.

    The cgroup parent, the wakeup sockets and the cache follow DATA_DIR, so one worker's reaper
    test (which removes the cgroups and session folders its database does not know) can never
    touch an evaluation of the other's. The uid pool stays host-wide: it is flock'ed.
    """
    from django.conf import settings

    from executor_project.config import close_to_others, django_secret_key

    shared = settings.EXECUTOR
    data_dir = shared.data_dir / "test-workers" / worker
    data_dir.mkdir(parents=True, exist_ok=True)
    close_to_others(data_dir)
    workspace_base = shared.workspace_base.with_name(f"{shared.workspace_base.name}-{worker}")
    settings.EXECUTOR = dataclasses.replace(shared, data_dir=data_dir, workspace_base=workspace_base)
    settings.SECRET_KEY = django_secret_key(settings.EXECUTOR)  # kept in DATA_DIR, as settings.py does


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """PostgreSQL test databases carry this checkout's mark too (test_test_gw0_<8 hex>): the runs
    of two checkouts on one server never create or drop each other's."""
    from django.conf import settings

    checkout = hashlib.sha256(str(PROJECT).encode()).hexdigest()[:8]
    for database in settings.DATABASES.values():
        if database["ENGINE"] == "django.db.backends.postgresql":
            test = database.setdefault("TEST", {})
            test["NAME"] = f"{test.get('NAME') or 'test_' + database['NAME']}_{checkout}"


@pytest.fixture
def api():
    """DRF's in-process test client: starts nothing; requests go to the test database (django_db)."""
    return APIClient()


@pytest.fixture
def executor_config(settings):
    """Change settings.EXECUTOR for one test: executor_config(max_concurrent_evals=1).

    Starts nothing; pytest-django's ``settings`` puts the old config back after the test."""

    def apply(**changes):
        settings.EXECUTOR = dataclasses.replace(settings.EXECUTOR, **changes)
        return settings.EXECUTOR

    return apply


@pytest.fixture
def www(tmp_path):
    """The folder the ``http_server`` fixture serves: made empty in the test's tmp_path (pytest removes it)."""
    folder = tmp_path / "www"
    folder.mkdir()
    return folder


@pytest.fixture
def http_server(www):
    """A TestHTTPServer on 127.0.0.1 serving ``www``: a thread started for the test, shut down after it."""
    with TestHTTPServer(www) as server:
        yield server


@pytest.fixture
def live_service(tmp_path):
    """Factory: live_service(env={...}, web_workers=3, worker=False) -> a started LiveService.

    Each call starts gunicorn (and run_worker with worker=True) as subprocesses on a database of
    their own (a SQLite file in tmp_path, or a new PostgreSQL database), migrated first. After the
    test every service started is stopped (SIGTERM, then SIGKILL after 40 s) and its database dropped.
    """
    started = []

    def start(**kwargs):
        service = LiveService(tmp_path / f"svc{len(started)}", **kwargs).start()
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()


@pytest.fixture(scope="session")
def debian_build():
    """`manage.py make_environment tools` run once per test run: (ENVIRONMENTS_ROOT, its CompletedProcess).

    Runs debootstrap (as root; skipped without it unless REQUIRE_SANDBOX=1) into a new
    ENVIRONMENTS_ROOT under /tmp, from the tarball cached in data/cache/debootstrap (downloaded
    once); the root and its data folder are removed when the test run ends.
    """
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        reason = "make_environment needs root and debootstrap"
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail(f"REQUIRE_SANDBOX=1 but {reason}")
        pytest.skip(reason)
    root = environment_helpers.environments_root()
    try:
        yield root, environment_helpers.build_real(root)
    finally:
        environment_helpers.remove_root(root)


@pytest.fixture(scope="session")
def debian_environment(debian_build):
    """A real environment built by make_environment: an ``Environment``, ENVIRONMENTS_ROOT its ``root.parent``.

    Starts nothing of its own: ``debian_build`` builds it and removes it at the end of the run.

    Debian bookworm minbase with python3, venv, pip, git, bash and `tree`, which the host
    lacks. The download is cached in data/cache/debootstrap between runs
    (tests/helpers/environments.py).
    """
    from evaluations.environments import resolve

    root, built = debian_build
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr
    return resolve(root, environment_helpers.NAME)


@pytest.fixture
def workspace_base():
    """Session folders where the sandbox uid can reach them (pytest's tmp_path is 0700): a folder made
    under /tmp, removed after the test."""
    base = Path(tempfile.mkdtemp(prefix="te-sessions-", dir="/tmp"))
    os.chmod(base, 0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def registry():
    """docker-registry on 127.0.0.1 over plain HTTP, for the whole run (tests push to their own names)."""
    images_helpers.need_registry()
    with images_helpers.RegistryServer() as server:
        yield server


@pytest.fixture(scope="session")
def base_layer(request) -> bytes:
    """The suite's Debian tree as one gzip'd layer (cached in data/cache/images between runs)."""
    images_helpers.need_root()
    return images_helpers.base_layer_tarball(lambda: request.getfixturevalue("debian_environment").root).read_bytes()


@pytest.fixture(scope="session")
def base_image(registry, base_layer):
    """(registry, ref, digest): the suite's Debian tree pushed as ``base/debian:bookworm``.

    Cheap on re-runs: the layer tarball is cached, so debootstrap runs only the first time.
    """
    blob = base_layer
    pushed = images_helpers.push_image(
        registry,
        "base/debian:bookworm",
        layers=[blob],
        config={"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["bash"]},
    )
    return registry, pushed.ref, pushed.digest


@pytest.fixture(scope="session")
def base_layer_unpacked(base_image, tmp_path_factory) -> Path:
    """The suite's Debian layer as a real pull unpacks it (``layers/<hex>/`` of an image store), pulled
    once a run from ``base_image``: ``seed_image_store`` gives each test's store a hard-linked copy
    (tests/helpers/images.py)."""
    from django.conf import settings

    from evaluations.images.pull import pull
    from evaluations.images.store import ImageStore

    registry, ref, _ = base_image
    root = tmp_path_factory.mktemp("base-layer-store")
    config = dataclasses.replace(
        settings.EXECUTOR,
        images_dir=root,
        image_insecure_registries=(registry.host,),
        allowed_private_hosts=("127.0.0.1",),
    )
    store = ImageStore(root)
    record = pull(ref, store=store, config=config).record
    (layer_id,) = record.layers
    return store.layer_dir(layer_id)


@pytest.fixture
def seeded_images(base_layer_unpacked, tmp_path) -> Path:
    """IMAGES_DIR for a service or a command of the test's own, holding the Debian layer already
    (tests/helpers/images.py's ``seed_image_store``)."""
    return images_helpers.seed_image_store(tmp_path / "seeded-images", base_layer_unpacked)


@pytest.fixture(scope="session")
def hub_mirror(base_image, base_layer):
    """The registry on 127.0.0.1 as Docker Hub's mirror, holding ``debian:bookworm`` (the suite's Debian
    tree): what the example tasks' ``FROM debian:bookworm`` reaches with IMAGE_REGISTRY_MIRRORS."""
    registry, _, _ = base_image
    images_helpers.push_image(
        registry,
        "library/debian:bookworm",
        layers=[base_layer],
        config={"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["bash"]},
    )
    return registry
