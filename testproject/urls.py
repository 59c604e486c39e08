from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # Monitoring: who may read it is PGOUTBOX["VIEWS_AUTH"] (settings.py).
    path("pgoutbox/", include("django_pgoutbox.urls")),
]
