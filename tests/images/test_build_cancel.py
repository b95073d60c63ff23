"""A build's ``FROM`` pull stops with the evaluation's cancel (SPEC §21), as an image task's pull
does: a registry that sends the first bytes of the base image's layer and then nothing, and the
cancel set once those bytes have arrived. The build ends at once, not after IMAGE_FETCH_STALL_SECS.
"""

from __future__ import annotations

import os
import threading

import pytest

from evaluations.images.build import build
from evaluations.images.errors import ImageUnavailable
from evaluations.images.store import ImageStore
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.images import FakeRegistry, layer, member, need_root
from tests.images.build_support import config_for, environment, write_context
from tests.security.test_image_pull import BOUND, in_thread, leftovers, stalling_blob

pytestmark = pytest.mark.slow


def test_a_cancelled_build_stops_its_from_pull_mid_layer(bwrap_runtime, tmp_path):
    need_root()
    store = ImageStore(tmp_path / "images")
    blob = layer(member("data", os.urandom(300_000)))
    sent, release, cancel = threading.Event(), threading.Event(), threading.Event()
    with TestHTTPServer() as server:
        try:
            fake = FakeRegistry(server, "cancel/base", "v1", [blob])
            server.route(
                f"/v2/cancel/base/blobs/{fake.layer_digests[0]}", stalling_blob(blob, sent, release, first=1000)
            )
            config = config_for(
                store.root,
                ALLOWED_PRIVATE_HOSTS="127.0.0.1",
                IMAGE_INSECURE_REGISTRIES=f"127.0.0.1:{server.port}",
                DOWNLOAD_TIMEOUT_SECS="600",  # the stall bound stays its default 60 s
            )
            context = write_context(tmp_path / "context", {"Dockerfile": f"FROM {fake.ref}\nENV A=1\n"})
            env = environment(bwrap_runtime, config, cancel_event=cancel)
            thread, outcome = in_thread(lambda: build(context / "Dockerfile", context, store=store, env=env))
            assert sent.wait(BOUND)
            cancel.set()
            thread.join(BOUND)  # well under the stall bound: the pull's watcher saw the cancel
            assert not thread.is_alive()
        finally:
            release.set()
    assert isinstance(outcome["error"], ImageUnavailable), outcome
    assert "cancelled" in str(outcome["error"])
    assert leftovers(store) == [] and store.images() == []
