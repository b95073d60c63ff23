"""The worker's wake-up socket (evaluations/worker/wakeup.py): bound and reached whatever DATA_DIR's depth.

A socket's path is capped at 107 bytes by the kernel; pytest's folders (pytest-of-root/pytest-181/
popen-gw1/test_<long name>0/svc0/data/wake/<uuid>.sock) pass it, and a worker that cannot bind its
wake socket dies at start: every live-service test of the full suite then waited for nothing.
"""

import select
import uuid

import pytest

from evaluations.worker import wakeup


@pytest.mark.django_db
def test_a_wake_socket_deeper_than_a_socket_path_holds_is_bound_and_woken(tmp_path):
    data_dir = tmp_path / ("d" * 60) / ("e" * 60)
    worker = wakeup.WakeSocket(data_dir, str(uuid.uuid4()))
    try:
        assert len(str(worker.path)) > 107 and worker.path.exists()
        wakeup.notify(data_dir)
        readable, _, _ = select.select([worker], [], [], 30)
        assert readable == [worker]
        worker.drain()
    finally:
        worker.close()
    assert not worker.path.exists()
