"""The admin's pages as Django's own look, on the installed Django (5.2 or 6.x): breadcrumbs,
read-only detail pages, the buttons of a detail page, what a detail page shows and links to, the
jobs' filters. Through Django's test client on real rows."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import transaction
from django.test import Client
from django.utils import timezone

from django_pgoutbox import enqueue
from django_pgoutbox.inbox import accept_message
from django_pgoutbox.models import InboxMessage, ScheduleCursor
from tests.integration.test_admin import dead_job
from tests.integration.test_delivery_operations import FIRST, delivery, event, register_two

pytestmark = pytest.mark.django_db

ADMIN = "/admin/pgoutbox/"


def breadcrumbs(page: Any) -> str:
    (found,) = re.findall(r'<nav aria-label="Breadcrumbs">(.*?)</nav>', page.content.decode(), re.S)
    return " ".join(found.split())


def container(crumbs: str) -> str:
    """The element that holds the breadcrumbs: ``ol`` or ``div``."""
    match = re.match(r'<(ol|div) class="breadcrumbs">', crumbs)
    assert match, crumbs
    return match.group(1)


def changer(client: Client) -> Client:
    """A staff user with every permission of the app but delete."""
    user = User.objects.create_user("changer", password="pw", is_staff=True)
    for permission in Permission.objects.filter(content_type__app_label="pgoutbox"):
        if not permission.codename.startswith("delete_"):
            user.user_permissions.add(permission)
    client.force_login(user)
    return client


class TestBreadcrumbs:
    def test_the_apps_own_pages_draw_them_as_djangos_pages_do(self, admin_client: Client) -> None:
        job = dead_job()
        django_page = breadcrumbs(admin_client.get(f"{ADMIN}job/{job.pk}/change/"))
        overview = breadcrumbs(admin_client.get(f"{ADMIN}job/overview/"))
        confirm = breadcrumbs(
            admin_client.post(
                f"{ADMIN}deadletter/", {"action": "retry_now", "_selected_action": [job.pk]}
            )
        )
        kind = container(django_page)
        assert container(overview) == container(confirm) == kind
        if kind == "ol":
            assert '<li aria-current="page">Queues overview</li>' in overview
            assert '<li><a href="/admin/pgoutbox/deadletter/">Dead letters</a></li>' in confirm
            assert '<li aria-current="page">Retry dead letters</li>' in confirm
            assert "&rsaquo;" not in overview + confirm
        else:
            assert overview.endswith("&rsaquo; Queues overview </div>")
            assert '&rsaquo; <a href="/admin/pgoutbox/deadletter/">Dead letters</a>' in confirm
            assert confirm.endswith("&rsaquo; Retry dead letters </div>")
        assert '<a href="/admin/pgoutbox/">Outbox and jobs</a>' in overview


class TestReadOnlyDetailPages:
    @pytest.mark.parametrize("who", ["superuser", "changer"])
    def test_every_detail_page_is_a_view_without_save(
        self, client: Client, admin_user: User, registry: None, who: str
    ) -> None:
        if who == "superuser":
            client.force_login(admin_user)
        else:
            changer(client)
        register_two()
        dead = dead_job()
        pending = enqueue("tests.behave", {})
        made = event(1)
        ScheduleCursor.objects.create(name="pgoutbox.prune", last_slot_at=timezone.now())
        with transaction.atomic():
            accept_message("stripe", "m-1")
        pages = {
            f"deadletter/{dead.pk}": "View dead letter",
            f"job/{pending.pk}": "View job",
            f"outboxevent/{made.pk}": "View outbox event",
            f"outboxdelivery/{delivery(made, FIRST, 'dead').pk}": "View outbox delivery",
            "schedulecursor/pgoutbox.prune": "View schedule cursor",
            f"inboxmessage/{InboxMessage.objects.get().pk}": "View inbox message",
        }
        for path, title in pages.items():
            page = admin_client_get(client, f"{ADMIN}{path}/change/")
            text = page.content.decode()
            assert f"<h1>{title}</h1>" in text, path
            assert f"| {title} |" in text, path  # the <title>
            for name in ("_save", "_continue", "_addanother", "_saveasnew"):
                assert f'name="{name}"' not in text, (path, name)
            assert 'class="closelink"' in text, path


def admin_client_get(client: Client, url: str) -> Any:
    page = client.get(url)
    assert page.status_code == 200, url
    return page
