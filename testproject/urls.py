from django.contrib import admin
from django.urls import include, path

from testproject.demo.webhooks import stripe_webhook

urlpatterns = [
    path("admin/", admin.site.urls),
    # Monitoring: who may read it is PGOUTBOX["VIEWS_AUTH"] (settings.py).
    path("pgoutbox/", include("django_pgoutbox.urls")),
    # The view of docs/howto/webhooks-in.md.
    path("webhooks/stripe/", stripe_webhook),
]
