"""A multi-stage build whose first stage installs a Debian package with apt-get and a PyPI package
with pip, through the evaluation's egress proxy (BUILD_NETWORK=on), and whose second stage copies
them out (SPEC §16).

The registries resolve to a TEST-NET address here, which the default rules refuse as private:
the test allows them by name, as an operator would with EGRESS_ALLOW, and checks that without
that allowance the same RUN fails with its output in the error.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from evaluations.images.build import build
from evaluations.images.errors import ImageError
from evaluations.network.egress import EgressPolicy, EgressProxy
from evaluations.runtime import initbin
from evaluations.runtime.policy import SANDBOX_CA_BUNDLE
from tests.images.build_support import BASE_REF, config_for, environment, write_context
from tests.runtime.support import UID

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="builds mount image roots: root only")]
REGISTRIES = "deb.debian.org,security.debian.org,pypi.org,files.pythonhosted.org"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

DOCKERFILE = f"""\
FROM {BASE_REF} AS deps
RUN apt-get update -q && apt-get install -y -q --no-install-recommends hello && hello -g built
RUN python3 -m pip install -q --no-cache-dir --disable-pip-version-check --target /opt/pylib six
FROM {BASE_REF}
COPY --from=deps /usr/bin/hello /usr/local/bin/hello
COPY --from=deps /opt/pylib /opt/pylib
RUN hello -g "from stage two" > /greeting && PYTHONPATH=/opt/pylib python3 -c "import six; print(six.PY3)" > /six
"""


@pytest.fixture
def proxy_folder():
    folder = Path(tempfile.mkdtemp(prefix="te-build-egress-", dir="/tmp"))
    os.chmod(folder, 0o711)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start_proxy(folder: Path, allow: str) -> EgressProxy:
    return EgressProxy(folder / f"egress-{len(allow)}.sock", EgressPolicy.from_strings(allow, ""), UID,
                       step="build").start()  # fmt: skip


def network_env(runtime, images_dir: Path, folder: Path, proxy: EgressProxy):
    return environment(
        runtime,
        config_for(images_dir, BUILD_NETWORK="on"),
        egress_socket=Path(proxy.socket_path),
        relay_init=initbin.ensure_init(folder),
        ca_bundle=CA_BUNDLE,
        extra_env={"SSL_CERT_FILE": SANDBOX_CA_BUNDLE, "PIP_CERT": SANDBOX_CA_BUNDLE},
    )


def test_a_multi_stage_build_installs_from_debian_and_pypi_through_the_proxy(
    bwrap_runtime, build_store, build_images_dir, debian_image, proxy_folder, tmp_path
):
    context = write_context(tmp_path / "ctx", {"Dockerfile": DOCKERFILE})
    proxy = start_proxy(proxy_folder, REGISTRIES)
    try:
        env = network_env(bwrap_runtime, build_images_dir, proxy_folder, proxy)
        result = build(context / "Dockerfile", context, None, None, store=build_store, env=env)
        allowed = {record.host for record in proxy.records() if record.allowed}
    finally:
        proxy.close()
    record = result.record
    top = {path: build_store.layer_tree(layer) / path for layer in record.layers for path in ("greeting", "six")}
    assert (top["greeting"]).read_text() == "from stage two\n" and top["six"].read_text() == "True\n"
    assert not any((build_store.layer_tree(layer) / "var/lib/apt/lists").exists() for layer in record.layers[1:])
    assert {"deb.debian.org", "pypi.org", "files.pythonhosted.org"} <= allowed
    assert len(env.progress.ran()) == 3


def test_without_the_registries_allowed_the_run_fails_with_its_output(
    bwrap_runtime, build_store, build_images_dir, debian_image, proxy_folder, tmp_path
):
    dockerfile = f"FROM {BASE_REF}\nRUN python3 -m pip download --retries 0 --timeout 5 --no-deps -d /tmp six\n"
    context = write_context(tmp_path / "ctx", {"Dockerfile": dockerfile})
    proxy = start_proxy(proxy_folder, "")
    try:
        env = network_env(bwrap_runtime, build_images_dir, proxy_folder, proxy)
        with pytest.raises(ImageError) as caught:
            build(context / "Dockerfile", context, None, None, store=build_store, env=env)
        refused = [(r.host, r.reason) for r in proxy.records() if not r.allowed]
    finally:
        proxy.close()
    message = str(caught.value)
    assert message.startswith("Dockerfile line 2 (RUN): the command 'python3 -m pip download") and "six" in message
    assert "its output ends:" in message and ("pypi.org", "private address") in refused
