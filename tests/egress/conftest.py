"""The runtime tests' sandbox fixtures (a Spawner with the Bubblewrap runtime, its session folder)."""

from tests.runtime.conftest import bwrap_probe, bwrap_runtime, bwrap_sp, session  # noqa: F401
