"""django-prometheus' request metrics, recorded by its own middleware, each labelled series found once.

``PrometheusAfterMiddleware`` records its series through ``metric.labels(...)``
eight times a request, and each call checks the label names, turns every value
into a string and takes a lock to find the same series again: a fifth of the
Python the middleware runs. Here the series ``labels()`` returned is kept per
metric and label values and used again. prometheus_client never drops a
series, so it is the very object ``labels()`` would return: the same figures
are recorded.
"""

from __future__ import annotations

from django_prometheus import middleware

MAX_SERIES = 10_000  # the values are views, methods, statuses...: a bound for the unforeseen


class PrometheusAfterMiddleware(middleware.PrometheusAfterMiddleware):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._series: dict[tuple, object] = {}

    def label_metric(self, metric, request, response=None, **labels):
        if not labels:
            return metric
        key = (metric, *labels.items())
        series = self._series.get(key)
        if series is None:
            series = metric.labels(**labels)
            if len(self._series) < MAX_SERIES:
                self._series[key] = series
        return series
