from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("evaluations.api.urls")),
]

handler400 = "evaluations.api.errors.handler400"
handler403 = "evaluations.api.errors.handler403"
handler404 = "evaluations.api.errors.handler404"
handler500 = "evaluations.api.errors.handler500"
