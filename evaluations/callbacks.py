"""Delivering the final evaluation JSON to callback_url.

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
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from django.db import close_old_connections, connections
from django.db.models import Q
from django.utils import timezone

from evaluations.models import CallbackAttempt, Evaluation
from evaluations.pipeline import urlguard
from evaluations.representation import evaluation_json

logger = logging.getLogger("term_executor.callbacks")

MAX_TRIES = 5
BACKOFF_SECS = (1, 2, 4, 8)  # wait before tries 2..5
TIMEOUT_SECS = 10
LEASE_SECS = 60  # longer than one try can take
MAX_RESPONSE_BYTES = 64 * 1024


def sign(body: bytes, secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def lease_due(limit: int) -> list:
    """Take up to `limit` due deliveries for this process; returns their eval ids."""
    now = timezone.now()
    due = (
        Evaluation.objects.filter(callback_state="pending", callback_next_at__lte=now)
        .filter(Q(callback_lease_until__isnull=True) | Q(callback_lease_until__lt=now))
        .order_by("callback_next_at")
        .values_list("id", flat=True)[:limit]
    )
    leased = []
    for eval_id in due:
        taken = (
            Evaluation.objects.filter(id=eval_id, callback_state="pending")
            .filter(Q(callback_lease_until__isnull=True) | Q(callback_lease_until__lt=now))
            .update(callback_lease_until=now + timezone.timedelta(seconds=LEASE_SECS))
        )
        if taken:
            leased.append(eval_id)
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


def deliver(eval_id, config) -> str:
    """One try; records it and moves the state on. Returns the new state."""
    evaluation = Evaluation.objects.prefetch_related("transitions", "test_results").get(id=eval_id)
    attempt = evaluation.callback_attempts.count() + 1
    body = json.dumps(evaluation_json(evaluation), separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "term-executor",
        "X-Eval-Id": str(eval_id),
        "X-Callback-Attempt": str(attempt),
    }
    if config.callback_secret:
        headers["X-Signature"] = sign(body, config.callback_secret)
    started = time.monotonic()
    status_code, error, hopeless = None, "", False
    try:
        status_code = _post(evaluation.callback_url, body, headers, config)
        if not 200 <= status_code < 300:
            error = f"receiver answered HTTP {status_code}"
    except urlguard.URLRefused as exc:
        error, hopeless = str(exc), True  # a refused URL will not become allowed by retrying
    except (OSError, ValueError) as exc:
        error = f"{exc.__class__.__name__}: {exc}".strip()
    CallbackAttempt.objects.create(
        evaluation_id=eval_id,
        attempt=attempt,
        status_code=status_code,
        error=error[:1000],
        duration_ms=int((time.monotonic() - started) * 1000),
    )
    if not error:
        state, next_at = "delivered", None
    elif hopeless or attempt >= MAX_TRIES:
        state, next_at = "failed", None
    else:
        state = "pending"
        next_at = timezone.now() + timezone.timedelta(seconds=BACKOFF_SECS[attempt - 1])
    Evaluation.objects.filter(id=eval_id).update(
        callback_state=state, callback_next_at=next_at, callback_lease_until=None
    )
    log = logger.info if state != "failed" else logger.warning
    log("callback try %d: %s", attempt, error or f"delivered (HTTP {status_code})", extra={"eval_id": str(eval_id)})
    return state


class Dispatcher:
    """The worker's pool of callback senders."""

    def __init__(self, config, threads: int = 4):
        self.config = config
        self.threads = threads
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="callback")
        self.inflight: set = set()

    def dispatch(self) -> int:
        free = self.threads - len(self.inflight)
        if free <= 0:
            return 0
        leased = lease_due(free)
        for eval_id in leased:
            self.inflight.add(eval_id)
            self.pool.submit(self._run, eval_id)
        return len(leased)

    def _run(self, eval_id) -> None:
        try:
            close_old_connections()
            deliver(eval_id, self.config)
        except Exception:
            logger.exception("callback delivery crashed", extra={"eval_id": str(eval_id)})
        finally:
            connections.close_all()
            self.inflight.discard(eval_id)

    def shutdown(self, wait: bool = False) -> None:
        self.pool.shutdown(wait=wait, cancel_futures=True)
