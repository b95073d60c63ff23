"""A client for term-executor's live sandboxes (SPEC §24), and a Harbor environment built on it.

``Client`` and ``AsyncClient`` speak the HTTP API; ``term_executor_client.harbor`` (imported on its
own, since it needs Harbor) holds ``TermExecutorEnvironment``.
"""

from term_executor_client.aio import AsyncClient, AsyncSandbox
from term_executor_client.client import Client, Sandbox
from term_executor_client.errors import TermExecutorError

__all__ = ["AsyncClient", "AsyncSandbox", "Client", "Sandbox", "TermExecutorError"]
__version__ = "0.1.0"
