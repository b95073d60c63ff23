from django.contrib import admin
from django.urls import path, re_path

from evaluations.api import urls as api
from executor_project.home import favicon, home
from executor_project.static import static_file

urlpatterns = [
    # The API's routes first, in this list rather than include()d: a request platforms send is
    # resolved with the fewest patterns tried and one ResolverMatch built, not one per level.
    *api.urlpatterns,
    path("admin/", admin.site.urls),
    re_path(r"^static/(?P<path>.+)$", static_file, name="static"),  # the admin's and /api/docs' files
    path("", home, name="home"),
    path("favicon.ico", favicon, name="favicon"),  # browsers ask for it on every page
]

handler400 = "evaluations.api.errors.handler400"
handler403 = "evaluations.api.errors.handler403"
handler404 = "evaluations.api.errors.handler404"
handler500 = "evaluations.api.errors.handler500"
