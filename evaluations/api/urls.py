from django.urls import path, register_converter
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularSwaggerView

from evaluations.api import artifacts, batches, events, logs, sandboxes, service, views
from evaluations.api.assets import AssetListView
from evaluations.api.environments import EnvironmentListView
from evaluations.api.images import ImageListView
from evaluations.api.metrics import metrics_view


class ArtifactPathConverter:
    """As Django's ``path`` (any characters, ``/`` too), newlines as well: an artifact path holding
    one reaches the view and gets its 400, not a 404 for no route. The view checks the name."""

    regex = r"[\s\S]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(ArtifactPathConverter, "artifact_path")

urlpatterns = [
    path("health", service.HealthView.as_view(), name="health"),
    path("status", service.StatusView.as_view(), name="status"),
    path("public-key", service.PublicKeyView.as_view(), name="public-key"),
    path("metrics", metrics_view, name="metrics"),
    path("evaluate", views.EvaluateView.as_view(), name="evaluate"),
    path("evaluate/<str:eval_id>", views.EvaluationDetailView.as_view(), name="evaluation-detail"),
    path("evaluate/<str:eval_id>/logs", logs.EvaluationLogView.as_view(), name="evaluation-logs"),
    path("evaluate/<str:eval_id>/events", events.EvaluationEventsView.as_view(), name="evaluation-events"),
    path(
        "evaluate/<str:eval_id>/artifacts/<artifact_path:path>",
        artifacts.EvaluationArtifactView.as_view(),
        name="evaluation-artifact",
    ),
    path("evaluate/<str:eval_id>/retry", views.EvaluationRetryView.as_view(), name="evaluation-retry"),
    path("evaluations", views.EvaluationListView.as_view(), name="evaluation-list"),
    path("batches", batches.BatchListView.as_view(), name="batch-list"),
    path("batches/<str:batch_id>", batches.BatchDetailView.as_view(), name="batch-detail"),
    path("batches/<str:batch_id>/events", events.BatchEventsView.as_view(), name="batch-events"),
    path("assets", AssetListView.as_view(), name="asset-list"),
    path("environments", EnvironmentListView.as_view(), name="environment-list"),
    path("images", ImageListView.as_view(), name="image-list"),
    path("sandboxes", sandboxes.SandboxListView.as_view(), name="sandbox-list"),
    path("sandboxes/<str:sandbox_id>", sandboxes.SandboxDetailView.as_view(), name="sandbox-detail"),
    path("sandboxes/<str:sandbox_id>/exec", sandboxes.SandboxExecView.as_view(), name="sandbox-exec"),
    path("sandboxes/<str:sandbox_id>/files", sandboxes.SandboxFilesView.as_view(), name="sandbox-files"),
    path("sandboxes/<str:sandbox_id>/network", sandboxes.SandboxNetworkView.as_view(), name="sandbox-network"),
    path(
        "sandboxes/<str:sandbox_id>/services/<str:name>/stop",
        sandboxes.SandboxServiceStopView.as_view(),
        name="sandbox-service-stop",
    ),
    path("api/schema", SpectacularJSONAPIView.as_view(), name="api-schema"),
    path("api/docs", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]
