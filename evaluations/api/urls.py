from django.urls import path

from evaluations.api import views
from evaluations.metrics import metrics_view

urlpatterns = [
    path("health", views.HealthView.as_view(), name="health"),
    path("status", views.StatusView.as_view(), name="status"),
    path("metrics", metrics_view, name="metrics"),
    path("evaluate", views.EvaluateView.as_view(), name="evaluate"),
    path("evaluate/<str:eval_id>", views.EvaluationDetailView.as_view(), name="evaluation-detail"),
    path("evaluations", views.EvaluationListView.as_view(), name="evaluation-list"),
]
