from django.contrib import admin
from django.urls import include, path, re_path

from executor_project.static import static_file

urlpatterns = [
    path("admin/", admin.site.urls),
    re_path(r"^static/(?P<path>.+)$", static_file, name="static"),  # the admin's and /api/docs' files
    path("", include("evaluations.api.urls")),
]

handler400 = "evaluations.api.errors.handler400"
handler403 = "evaluations.api.errors.handler403"
handler404 = "evaluations.api.errors.handler404"
handler500 = "evaluations.api.errors.handler500"
