"""The largest request body the API reads, from the caps of what a request may hold.

Plain Python below Django: settings.py gives Django's own cap (DATA_UPLOAD_MAX_MEMORY_SIZE) the
same figure the API's JSON parser holds bodies to, so the two never drift.
"""

from evaluations.network.urlguard import MAX_URL_CHARS
from executor_project.config import Config


def max_body_bytes(config: Config) -> int:
    """413 past it: agent_code JSON-escaped (each byte as \\u00XX, 6 bytes) or agent_archive in
    base64 (4/3), a batch's task_urls (each up to MAX_URL_CHARS, twice for escaped slashes, and its
    quotes), and 1 MiB for the rest."""
    agent = max(config.max_agent_code_bytes * 6, -(-config.max_agent_archive_bytes // 3) * 4)
    task_urls = config.max_batch_tasks * (MAX_URL_CHARS * 2 + 4)
    return agent + task_urls + 1024 * 1024
