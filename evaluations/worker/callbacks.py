"""Delivering the final evaluation JSON (or a finished batch's JSON) to callback_url.

1. lifecycle.finish marks a terminal evaluation with a callback_url as
   `pending`; nothing on the evaluation's path waits for the receiver.
2. The worker's Dispatcher leases due deliveries with a conditional UPDATE
   (so several workers never POST the same attempt twice) and sends them from
   a small thread pool: a slow or dead receiver holds a thread, never an
   evaluation slot.
3. Each try is a CallbackAttempt row. 5 tries, waiting 1, 2, 4, 8 s between
   them; then `failed`. The state lives in the database, so a restarted worker
   picks up where the last one stopped.
4. The URL rules of task URLs apply, and the connection goes to the checked
   address; redirects are not followed (a receiver answers, it does not move).
5. A batch is called back the same way, once, when it ends (lifecycle.settle marks it
   `pending`); its evaluations send none of their own.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.db import close_old_connections, connections
from django.db.models import Q
from django.utils import timezone

from evaluations import representation
from evaluations.models import Batch, CallbackAttempt, CallbackState, Evaluation
from evaluations.network import urlguard
from evaluations.representation import evaluation_json

logger = logging.getLogger("term_executor.callbacks")

MAX_TRIES = 5
BACKOFF_SECS = (1, 2, 4, 8)  # wait before tries 2..5
TIMEOUT_SECS = 10
LEASE_SECS = 60  # longer than one try can take
MAX_RESPONSE_BYTES = 64 * 1024


def sign(body: bytes, secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Sender:
    """What is called back: evaluations (their JSON) or batches (GET /batches/{id}'s JSON).

    Both models hold callback_url/_state/_next_at/_lease_until, and CallbackAttempt points at one
    of them by ``owner``; leasing, signing, retries and the record are the same code for both.
    """

    model: type
    owner: str  # CallbackAttempt's column for the sender's id
    header: str  # the id header of the POST
    body: Callable[[object], dict]

    # Log lines carry an evaluation's id as eval_id (the log formats show it); a batch's is in the line.
    def label(self, row_id) -> str:
        return "" if self.owner == "evaluation_id" else f"batch {row_id}: "

    def log_extra(self, row_id) -> dict:
        return {"eval_id": str(row_id)} if self.owner == "evaluation_id" else {}


def _evaluation_body(eval_id) -> dict:
    return evaluation_json(Evaluation.objects.prefetch_related("transitions", "test_results").get(id=eval_id))


EVALUATIONS = Sender(Evaluation, "evaluation_id", "X-Eval-Id", _evaluation_body)
BATCHES = Sender(Batch, "batch_id", "X-Batch-Id", representation.batch_json)
SENDERS = (EVALUATIONS, BATCHES)


def lease_due(limit: int, sender: Sender = EVALUATIONS) -> list:
    """Take up to `limit` due deliveries of `sender` for this process; returns their ids."""
    now = timezone.now()
    free = Q(callback_lease_until__isnull=True) | Q(callback_lease_until__lt=now)
    due = (
        sender.model.objects.filter(callback_state=CallbackState.PENDING, callback_next_at__lte=now)
        .filter(free)
        .order_by("callback_next_at")
        .values_list("id", flat=True)[:limit]
    )
    leased = []
    for row_id in due:
        taken = (
            sender.model.objects.filter(id=row_id, callback_state=CallbackState.PENDING)
            .filter(free)
            .update(callback_lease_until=now + timezone.timedelta(seconds=LEASE_SECS))
        )
        if taken:
            leased.append(row_id)
    return leased


def _post(url: str, body: bytes, headers: dict, config) -> int:
    policy = urlguard.URLPolicy(("http", "https"), config.allow_private_urls, tuple(config.allowed_private_hosts))
    resolved = policy.check(url, label="callback_url")
    conn = urlguard.pinned_connection(resolved, timeout_secs=TIMEOUT_SECS)
    try:
        conn.request("POST", resolved.target, body=body, headers=headers)
        response = conn.getresponse()
        response.read(MAX_RESPONSE_BYTES)
        return response.status
    finally:
        conn.close()


def deliver(row_id, config, sender: Sender = EVALUATIONS) -> CallbackState:
    """One try; records it and moves the state on. Returns the new state."""
    callback_url = sender.model.objects.values_list("callback_url", flat=True).get(id=row_id)
    attempt = CallbackAttempt.objects.filter(**{sender.owner: row_id}).count() + 1
    body = json.dumps(sender.body(row_id), separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "term-executor",
        sender.header: str(row_id),
        "X-Callback-Attempt": str(attempt),
    }
    if config.callback_secret:
        headers["X-Signature"] = sign(body, config.callback_secret)
    started = time.monotonic()
    status_code, error, hopeless = None, "", False
    try:
        status_code = _post(callback_url, body, headers, config)
        if not 200 <= status_code < 300:
            error = f"receiver answered HTTP {status_code}"
    except urlguard.URLRefused as exc:
        error, hopeless = str(exc), True  # a refused URL will not become allowed by retrying
    except (OSError, ValueError) as exc:
        error = f"{exc.__class__.__name__}: {exc}".strip()
    CallbackAttempt.objects.create(
        **{sender.owner: row_id},
        attempt=attempt,
        status_code=status_code,
        error=error[:1000],
        duration_ms=int((time.monotonic() - started) * 1000),
    )
    if not error:
        state, next_at = CallbackState.DELIVERED, None
    elif hopeless or attempt >= MAX_TRIES:
        state, next_at = CallbackState.FAILED, None
    else:
        state = CallbackState.PENDING
        next_at = timezone.now() + timezone.timedelta(seconds=BACKOFF_SECS[attempt - 1])
    sender.model.objects.filter(id=row_id).update(
        callback_state=state, callback_next_at=next_at, callback_lease_until=None
    )
    log = logger.info if state != CallbackState.FAILED else logger.warning
    log("%scallback try %d: %s", sender.label(row_id), attempt, error or f"delivered (HTTP {status_code})",
        extra=sender.log_extra(row_id))  # fmt: skip
    return state


class Dispatcher:
    """The worker's pool of callback senders."""

    def __init__(self, config, threads: int = 4):
        self.config = config
        self.threads = threads
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="callback")
        self.inflight: set = set()

    def dispatch(self) -> int:
        count = 0
        for sender in SENDERS:
            free = self.threads - len(self.inflight)
            if free <= 0:
                break
            for row_id in lease_due(free, sender):
                self.inflight.add(row_id)
                self.pool.submit(self._run, row_id, sender)
                count += 1
        return count

    def _run(self, row_id, sender: Sender) -> None:
        try:
            close_old_connections()
            deliver(row_id, self.config, sender)
        except Exception:
            logger.exception("%scallback delivery crashed", sender.label(row_id), extra=sender.log_extra(row_id))
        finally:
            connections.close_all()
            self.inflight.discard(row_id)

    def shutdown(self, wait: bool = False) -> None:
        self.pool.shutdown(wait=wait, cancel_futures=True)
