from django.urls import path

from django_pgoutbox import views

app_name = "pgoutbox"
urlpatterns = [
    path("metrics", views.metrics, name="metrics"),
    path("health", views.health, name="health"),
]
