"""GET /evaluations' paging, which GET /batches shares."""

from __future__ import annotations

import uuid
from urllib.parse import urlencode

from django.db.models import Q
from rest_framework.response import Response

from evaluations.api.errors import ApiError


class Page:
    """GET /evaluations' paging, which GET /batches shares: newest first, ``limit``, ``before``
    (the id of the last row of the previous page), ``status``; a ``Link: rel="next"`` header."""

    DEFAULT_LIMIT = 100
    MAX_LIMIT = 1000

    def __init__(self, request, rows, *, noun: str, statuses, by_status):
        """``rows``: the queryset of what the caller may see (auth.Caller.visible); ``before`` is one of them."""
        self.request = request
        params = request.query_params
        problems: dict[str, list[str]] = {}
        queryset = rows.order_by("-created_at", "-id")
        self.status = params.get("status")
        if self.status is not None:
            if self.status not in statuses:
                problems["status"] = [f"must be one of {', '.join(statuses)}"]
            else:
                queryset = by_status(queryset, self.status)
        self.limit = self.DEFAULT_LIMIT
        if params.get("limit") is not None:
            try:
                self.limit = int(params["limit"])
                if not 1 <= self.limit <= self.MAX_LIMIT:
                    raise ValueError
            except ValueError:
                problems["limit"] = [f"must be an integer from 1 to {self.MAX_LIMIT}"]
        before = params.get("before")
        if before is not None:
            anchor = None
            try:
                anchor = rows.filter(id=uuid.UUID(before)).values("id", "created_at").first()
            except ValueError:
                pass
            if anchor is None:
                problems["before"] = [f"must be the {noun}_id of an existing {noun}"]
            else:
                queryset = queryset.filter(
                    Q(created_at__lt=anchor["created_at"]) | Q(created_at=anchor["created_at"], id__lt=anchor["id"])
                )
        if problems:
            raise ApiError(
                400, "invalid_request", "the query is invalid: " + ", ".join(sorted(problems)), fields=problems
            )
        self.queryset = queryset

    def response(self, rows: list, to_json) -> Response:
        """``rows``: up to limit + 1 of the queryset's rows (one more tells there is a next page)."""
        headers = {}
        if len(rows) > self.limit:
            rows = rows[: self.limit]
            query = {"limit": str(self.limit), "before": str(rows[-1].id)}
            if self.status:
                query["status"] = self.status
            headers["Link"] = f'<{self.request.build_absolute_uri(self.request.path)}?{urlencode(query)}>; rel="next"'
        return Response([to_json(row) for row in rows], headers=headers)
