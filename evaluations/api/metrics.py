"""/metrics: django-prometheus' request metrics plus term_executor_* read from the database.

The evaluation figures are collected at scrape time from the database, so
whichever gunicorn worker answers, the numbers are the same, and a restart
loses nothing. The image figures are read at scrape time from the image store
(IMAGES_DIR/counters.json and its size), which every process that pulls or
builds on this host shares: the worker, `manage.py image`, a build's FROM. The request metrics are per process; with several gunicorn
workers they are merged through PROMETHEUS_MULTIPROC_DIR (gunicorn.conf.py).
"""

from __future__ import annotations

import os

from django.conf import settings
from django.http import HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from evaluations.cache.store import Store
from evaluations.db import stats
from evaluations.images.store import ImageStore, read_counts
from evaluations.models import SandboxStatus, Status


class EvaluationCollector:
    def collect(self):
        counts = stats.evaluation_counts()
        for name, key, help_text in (
            ("term_executor_evaluations", "total", "Evaluations admitted."),
            ("term_executor_evaluations_passed", "passed", "Evaluations that passed."),
        ):
            yield CounterMetricFamily(name, help_text, value=counts[key])
        # By error_kind (SPEC §14), each family summing to its status' count: a cancelled
        # evaluation (DELETE, TTL, the agent's timeout, a shutdown) counts under cancelled.
        by_kind = stats.error_kind_counts()
        for name, status, help_text in (
            ("term_executor_evaluations_failed", Status.FAILED, "Evaluations that ended failed, by error_kind."),
            (
                "term_executor_evaluations_cancelled",
                Status.CANCELLED,
                "Evaluations that ended cancelled, by error_kind.",
            ),
        ):
            family = CounterMetricFamily(name, help_text, labels=["error_kind"])
            for kind, value in sorted(by_kind.get(status, {}).items()):
                family.add_metric([kind], value)
            yield family
        yield GaugeMetricFamily("term_executor_evaluations_active", "Evaluations running now.", value=counts["running"])
        yield CounterMetricFamily(
            "term_executor_evaluations_duration_ms_sum",
            "Sum of the durations of ended evaluations, in milliseconds.",
            value=counts["duration_ms_sum"],
        )
        yield GaugeMetricFamily("term_executor_queue_depth", "Evaluations waiting.", value=counts["pending"])
        yield GaugeMetricFamily(
            "term_executor_capacity",
            "Evaluations a worker runs at once (MAX_CONCURRENT_EVALS).",
            value=settings.EXECUTOR.max_concurrent_evals,
        )
        yield CounterMetricFamily(
            "term_executor_cache_hits", "Evaluations started from a workspace snapshot.", value=counts["cache_hits"]
        )
        yield CounterMetricFamily(
            "term_executor_cache_misses", "Evaluations that cloned and installed.", value=counts["cache_misses"]
        )
        yield GaugeMetricFamily(
            "term_executor_cache_bytes",
            "Bytes the workspace cache holds on this host (snapshots and mirrors), read from its folder.",
            value=Store(settings.EXECUTOR.cache_root).size_bytes(),
        )
        yield from _image_families(settings.EXECUTOR.images_root)
        yield from _sandbox_families()
        histogram = HistogramMetricFamily(
            "term_executor_step_duration_seconds", "Time spent in each pipeline step.", labels=["step"]
        )
        for step, figures in stats.step_histograms().items():
            buckets = [(str(bound), count) for bound, count in figures["buckets"]]
            buckets.append(("+Inf", figures["count"]))
            histogram.add_metric([step], buckets, figures["sum_seconds"])
        yield histogram


def _sandbox_families():
    """Live sandboxes (SPEC §24): how many are live now, by status, and how many were made and execs run."""
    counts = stats.sandbox_counts()
    live = GaugeMetricFamily(
        "term_executor_sandboxes", "Live sandboxes now, by status (every host).", labels=["status"]
    )
    for status in (SandboxStatus.STARTING, SandboxStatus.READY):
        live.add_metric([status], counts[status])
    yield live
    ended = CounterMetricFamily("term_executor_sandboxes_ended", "Sandboxes that ended, by status.", labels=["status"])
    for status in (SandboxStatus.STOPPED, SandboxStatus.EXPIRED, SandboxStatus.FAILED):
        ended.add_metric([status], counts[status])
    yield ended
    yield CounterMetricFamily("term_executor_sandbox_execs", "Execs run in live sandboxes.", value=counts["execs"])


def _image_families(root):
    """The image store's counters (store.count) and size; zeros before the first image."""
    counts = read_counts(root)
    for name, key, help_text in (
        ("term_executor_image_pulls", "pulls", "Image pulls that downloaded at least one layer."),
        ("term_executor_image_builds", "builds", "Dockerfile builds that ran or copied at least one instruction."),
        (
            "term_executor_image_cache_hits",
            "cache_hits",
            "Images asked for (pulled or built) that the store had whole: nothing downloaded, nothing run.",
        ),
    ):
        yield CounterMetricFamily(name, help_text, value=counts[key])
    size = ImageStore(root).total_bytes() if root.is_dir() else 0
    yield GaugeMetricFamily(
        "term_executor_image_bytes",
        "Bytes the image store holds (unpacked layers and blobs), read from its folder.",
        value=size,
    )


_collector = EvaluationCollector()
_default_registered = False


def _registry() -> CollectorRegistry:
    global _default_registered
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(_collector)
        return registry
    if not _default_registered:
        REGISTRY.register(_collector)
        _default_registered = True
    return REGISTRY


def metrics_view(request):
    return HttpResponse(generate_latest(_registry()), content_type=CONTENT_TYPE_LATEST)
