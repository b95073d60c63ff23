"""A re-run: a new pending evaluation with an ended one's request, linked to it by ``retry_of``.

The one path for the admin's re-run action and ``POST /evaluate/{id}/retry``:
it is admitted like a POST (refused at capacity with admission.AtCapacity), and
it carries no idempotency key (each re-run is a new evaluation).
"""

from __future__ import annotations

from evaluations.api import admission
from evaluations.models import Evaluation
from executor_project.config import Config

# What POST /evaluate stored; a re-run submits the same.
REQUEST_FIELDS = (
    "agent_code",
    "agent_archive_id",  # stored once per content: the re-run shares the row
    "agent_entrypoint",
    "agent_sha256",
    "language",
    "task_url",
    "timeout_secs",
    "env",
    "static_assets",
    "callback_url",
    "metadata",
)


def retry(evaluation: Evaluation, *, config: Config, scope: str) -> Evaluation:
    """The new pending evaluation; raises admission.AtCapacity. ``scope``: who asks (the API token's, "admin").
    The new one is the original's owner's (SPEC §20), whoever asks: it sends its result to the owner's
    callback_url, and the owner's token must be able to read it."""
    fields = {name: getattr(evaluation, name) for name in REQUEST_FIELDS}
    new, _created = admission.admit(
        fields={**fields, "retry_of_id": evaluation.id, "owner": evaluation.owner},
        limit=config.admission_limit,
        scope=scope,
        key=None,
        request_sha256=evaluation.request_sha256,
        data_dir=config.data_dir,
    )
    return new
