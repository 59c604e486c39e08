"""The workflows' admin pages through Django's test client: the list, a workflow's page (its
graph, its table, its bounds), its cancel and the retry of a dead step, a job's workflow,
parents and children, and what a hostile user can throw at them.

Steps are made dead or completed by updating their rows, as a worker's outcome would; the
triggers of migration 0016 settle their children on those updates, in the test's transaction.
"""

from __future__ import annotations

import random
import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.utils import timezone

from django_pgoutbox import workflow
from django_pgoutbox.admin import graph, workflow_pages
from django_pgoutbox.admin.workflow_pages import DRAWN_STEPS
from django_pgoutbox.models import Job, JobDependency, JobStatus, Workflow

pytestmark = pytest.mark.django_db

LIST = "/admin/pgoutbox/workflow/"


def page_of(workflow_id: Any) -> str:
    return f"{LIST}{workflow_id}/change/"


def order() -> tuple[Workflow, dict[str, Job]]:
    """reserve -> charge -> ship -> notify (notify runs whatever happens to ship)."""
    flow = workflow("order")
    reserve = flow.add("tests.step", {}, name="reserve")
    charge = flow.add("tests.step", {}, name="charge", after=[reserve])
    ship = flow.add("tests.step", {}, name="ship", after=[charge])
    flow.add("tests.step", {}, name="notify", after=[ship], on_upstream_failure="run")
    written = flow.enqueue()
    return written.workflow, written.jobs


def random_dag(steps: int, seed: int = 7, name: str = "random") -> Workflow:
    """``steps`` steps, each after up to three steps drawn among those before it."""
    rng = random.Random(seed)
    flow = workflow(name)
    added: list[Any] = []
    for index in range(steps):
        parents = rng.sample(added, min(len(added), rng.randint(0, 3))) if index else []
        added.append(flow.add("tests.step", {}, name=f"s{index}", after=parents))
    return flow.enqueue().workflow


def end(job: Job, status: str, code: str | None = None) -> None:
    """Write the end of ``job`` as a worker would: the triggers settle its children."""
    now = timezone.now()
    Job.objects.filter(pk=job.pk).update(
        status=status,
        attempts=1,
        locked_at=now,
        finished_at=now,
        completed_at=now if status == JobStatus.COMPLETED else None,
        last_error_code=code,
    )


def statuses(jobs: dict[str, Job]) -> dict[str, str]:
    found = dict(
        Job.objects.filter(pk__in=[j.pk for j in jobs.values()]).values_list("pk", "status")
    )
    return {name: found[job.pk] for name, job in jobs.items()}


@pytest.fixture
def viewer(client: Client) -> Client:
    """A staff user who may view workflows and jobs, and change nothing."""
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    for model in ("workflow", "job"):
        user.user_permissions.add(Permission.objects.get(codename=f"view_{model}"))
    client.force_login(user)
    return client


class TestTheList:
    def test_newest_first_with_each_workflows_states_in_one_statement(
        self, admin_client: Client, django_assert_max_num_queries: Any
    ) -> None:
        first, jobs = order()
        end(jobs["reserve"], JobStatus.DEAD, "boom")  # cancels charge and ship
        Workflow.objects.filter(pk=first.pk).update(created_at=timezone.now() - timedelta(hours=1))
        for index in range(30):
            random_dag(5, seed=index, name=f"batch-{index}")
        with django_assert_max_num_queries(8):
            page = admin_client.get(LIST)
        assert page.status_code == 200
        text = page.content.decode()
        assert text.index("batch-29") < text.index(">order<")
        assert text.index("batch-0") < text.index(">order<")
        assert "1 dead, 1 pending, 2 cancelled" in text

    def test_search_by_id_and_by_name(self, admin_client: Client) -> None:
        first, _ = order()
        random_dag(3, name="nightly-export")
        by_id = admin_client.get(f"{LIST}?q={first.pk}").content.decode()
        assert ">order<" in by_id
        assert "nightly-export" not in by_id
        by_name = admin_client.get(f"{LIST}?q=export").content.decode()
        assert "nightly-export" in by_name
        assert ">order<" not in by_name

    def test_no_add_no_change_no_delete(self, admin_client: Client) -> None:
        wf, _ = order()
        assert admin_client.get(f"{LIST}add/").status_code == 403
        assert admin_client.get(f"{LIST}{wf.pk}/delete/").status_code == 403
        page = admin_client.get(LIST).content.decode()
        assert 'name="action"' not in page  # no bulk action, no delete_selected


class TestTheWorkflowPage:
    def test_a_small_workflow_its_graph_and_its_table(self, admin_client: Client) -> None:
        wf, jobs = order()
        end(jobs["reserve"], JobStatus.COMPLETED)
        page = admin_client.get(page_of(wf.pk))
        assert page.status_code == 200
        text = page.content.decode()
        svg = text[
            text.index('<svg id="workflow-graph"') : text.index(
                "</svg>", text.index('<svg id="workflow-graph"')
            )
        ]
        for name, job in jobs.items():
            assert f'href="/admin/pgoutbox/job/{job.pk}/change/"' in svg
            assert f">{name}<" in svg
        assert svg.count("<path d=") == 3  # the three edges
        assert "completed" in svg
        assert "pending" in svg  # charge, released by reserve
        table = text[text.index('<table id="steps"') :]
        assert table.index(">reserve<") < table.index(">charge<") < table.index(">notify<")
        assert "Cancel workflow" in text

    def test_two_hundred_steps_in_a_bounded_number_of_queries(
        self, admin_client: Client, django_assert_max_num_queries: Any
    ) -> None:
        wf = random_dag(200)
        steps = list(Job.objects.filter(workflow_id=wf.pk).values_list("pk", flat=True))
        with django_assert_max_num_queries(8):
            page = admin_client.get(page_of(wf.pk))
        assert page.status_code == 200
        text = page.content.decode()
        svg = text[
            text.index('<svg id="workflow-graph"') : text.index(
                "</svg>", text.index('<svg id="workflow-graph"')
            )
        ]
        for pk in steps:
            assert f'href="/admin/pgoutbox/job/{pk}/change/"' in svg
        assert svg.count("<path d=") == JobDependency.objects.filter(child_id__in=steps).count()
        assert len(page.content) < 600_000

    def test_a_big_workflow_draws_its_first_steps_by_layer_and_says_so(
        self, admin_client: Client, django_assert_max_num_queries: Any
    ) -> None:
        wf = random_dag(DRAWN_STEPS + 100, seed=3)
        last = Job.objects.filter(workflow_id=wf.pk).order_by("-id").first()
        assert last is not None
        Job.objects.filter(pk=last.pk).update(status=JobStatus.DEAD, last_error_code="boom")
        with django_assert_max_num_queries(8):
            page = admin_client.get(page_of(wf.pk))
        text = page.content.decode()
        svg = text[
            text.index('<svg id="workflow-graph"') : text.index(
                "</svg>", text.index('<svg id="workflow-graph"')
            )
        ]
        assert svg.count('class="step ') == DRAWN_STEPS
        assert f"the first {DRAWN_STEPS} of {DRAWN_STEPS + 100} steps" in text
        table = text[
            text.index('<table id="steps"') : text.index("</table>", text.index('id="steps"'))
        ]
        assert table.count("<tr id=") == DRAWN_STEPS
        # the last step is in the last layer, past the first 500: listed apart, with its retry
        dead = text[text.index('<table id="other-dead"') :]
        assert f'id="step-{last.pk}"' in dead
        assert f"/retry/{last.pk}/" in dead

    @pytest.mark.parametrize("object_id", ["not-a-uuid", "1' OR '1'='1", "%00", "x" * 5000])
    def test_a_bad_id_is_a_404(self, admin_client: Client, object_id: str) -> None:
        assert admin_client.get(page_of(object_id)).status_code == 404
        assert admin_client.get(f"{LIST}{object_id}/cancel/").status_code == 404

    def test_an_unknown_workflow_is_a_404(self, admin_client: Client) -> None:
        assert admin_client.get(page_of(uuid.uuid4())).status_code == 404
        assert admin_client.post(f"{LIST}{uuid.uuid4()}/cancel/").status_code == 404

    def test_html_in_a_step_name_is_escaped_in_the_graph_and_the_table(
        self, admin_client: Client
    ) -> None:
        hostile = '<script>alert("x")</script>&{0}'
        flow = workflow("<b>wf</b>")
        flow.add("<img src=x onerror=alert(1)>", {}, name=hostile)
        wf = flow.enqueue().workflow
        text = admin_client.get(page_of(wf.pk)).content.decode()
        assert "<script>alert" not in text
        assert "<img src=x" not in text
        assert "<b>wf</b>" not in text
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;{0}" in text
        svg = text[
            text.index('<svg id="workflow-graph"') : text.index(
                "</svg>", text.index('<svg id="workflow-graph"')
            )
        ]
        assert "&lt;script&gt;" in svg
        listed = admin_client.get(LIST).content.decode()
        assert "<b>wf</b>" not in listed

    def test_a_viewer_sees_no_cancel_and_no_retry(self, viewer: Client) -> None:
        wf, jobs = order()
        end(jobs["reserve"], JobStatus.DEAD, "boom")
        text = viewer.get(page_of(wf.pk)).content.decode()
        assert "Cancel workflow" not in text
        assert "/retry/" not in text


class TestCancel:
    def test_confirm_then_cancel(self, admin_client: Client) -> None:
        wf, jobs = order()
        end(jobs["reserve"], JobStatus.COMPLETED)
        url = f"{LIST}{wf.pk}/cancel/"
        confirm = admin_client.get(url)
        assert confirm.status_code == 200
        assert "3 steps not finished now" in confirm.content.decode()
        assert statuses(jobs)["charge"] == JobStatus.PENDING  # asking changed nothing
        done = admin_client.post(url, {"confirmed": "yes"}, follow=True)
        assert done.redirect_chain[-1][0] == page_of(wf.pk)
        assert "Cancelled 3 steps" in done.content.decode()
        assert statuses(jobs) == {
            "reserve": "completed",
            "charge": "cancelled",
            "ship": "cancelled",
            "notify": "cancelled",
        }
        assert LogEntry.objects.filter(object_id=str(wf.pk)).count() == 1

    def test_a_post_without_the_confirmation_only_asks(self, admin_client: Client) -> None:
        wf, jobs = order()
        page = admin_client.post(f"{LIST}{wf.pk}/cancel/")
        assert page.status_code == 200
        assert statuses(jobs)["reserve"] == JobStatus.PENDING

    def test_a_user_without_the_change_permission_is_refused(self, viewer: Client) -> None:
        wf, jobs = order()
        assert viewer.get(f"{LIST}{wf.pk}/cancel/").status_code == 403
        assert viewer.post(f"{LIST}{wf.pk}/cancel/", {"confirmed": "yes"}).status_code == 403
        assert statuses(jobs)["reserve"] == JobStatus.PENDING

    def test_a_finished_workflow_has_nothing_to_cancel(self, admin_client: Client) -> None:
        wf, jobs = order()
        end(jobs["reserve"], JobStatus.DEAD, "boom")  # charge, ship cancelled; notify pending
        end(jobs["notify"], JobStatus.COMPLETED)
        assert "Cancel workflow" not in admin_client.get(page_of(wf.pk)).content.decode()
        page = admin_client.get(f"{LIST}{wf.pk}/cancel/", follow=True)
        assert "nothing to cancel" in page.content.decode()


class TestRetry:
    def test_retrying_a_dead_step_puts_its_cancelled_dependants_back_to_waiting(
        self, admin_client: Client
    ) -> None:
        wf, jobs = order()
        end(jobs["reserve"], JobStatus.COMPLETED)
        end(jobs["charge"], JobStatus.DEAD, "boom")
        assert statuses(jobs)["ship"] == JobStatus.CANCELLED
        page = admin_client.get(page_of(wf.pk)).content.decode()
        url = f"{LIST}{wf.pk}/retry/{jobs['charge'].pk}/"
        assert f'href="{url}"' in page
        assert admin_client.get(url).status_code == 200  # the confirmation
        assert statuses(jobs)["charge"] == JobStatus.DEAD
        done = admin_client.post(url, {"confirmed": "yes"}, follow=True)
        assert "Retried step charge" in done.content.decode()
        assert statuses(jobs) == {
            "reserve": "completed",
            "charge": "pending",
            "ship": "waiting",
            "notify": "pending",  # it ran on charge's failure: released, and left so
        }
        assert LogEntry.objects.filter(object_id=str(jobs["charge"].pk)).count() == 1

    def test_a_step_no_longer_dead_is_left_alone(self, admin_client: Client) -> None:
        wf, jobs = order()
        url = f"{LIST}{wf.pk}/retry/{jobs['reserve'].pk}/"
        page = admin_client.post(url, {"confirmed": "yes"}, follow=True)
        assert "is not dead: nothing was done" in page.content.decode()
        assert statuses(jobs)["reserve"] == JobStatus.PENDING

    def test_a_job_of_another_workflow_or_a_bad_id_is_a_404(self, admin_client: Client) -> None:
        wf, _ = order()
        _, other = order()
        end(other["reserve"], JobStatus.DEAD, "boom")
        for job_id in (other["reserve"].pk, "nope", uuid.uuid4()):
            url = f"{LIST}{wf.pk}/retry/{job_id}/"
            assert admin_client.post(url, {"confirmed": "yes"}).status_code == 404
        assert statuses(other)["reserve"] == JobStatus.DEAD

    def test_a_user_without_the_change_permission_is_refused(self, viewer: Client) -> None:
        wf, jobs = order()
        end(jobs["reserve"], JobStatus.DEAD, "boom")
        url = f"{LIST}{wf.pk}/retry/{jobs['reserve'].pk}/"
        assert viewer.post(url, {"confirmed": "yes"}).status_code == 403
        assert statuses(jobs)["reserve"] == JobStatus.DEAD

    def test_only_get_and_post(self, admin_client: Client) -> None:
        wf, _ = order()
        assert admin_client.put(f"{LIST}{wf.pk}/cancel/").status_code == 405


class TestTheJobPage:
    def test_a_step_links_its_workflow_its_parents_and_its_children(
        self, admin_client: Client
    ) -> None:
        wf, jobs = order()
        end(jobs["reserve"], JobStatus.COMPLETED)
        text = admin_client.get(f"/admin/pgoutbox/job/{jobs['charge'].pk}/change/").content.decode()
        assert f'href="{page_of(wf.pk)}"' in text
        assert "step <strong>charge</strong>" in text
        assert (
            f'href="/admin/pgoutbox/job/{jobs["reserve"].pk}/change/">reserve</a> (completed)'
            in text
        )
        assert f'href="/admin/pgoutbox/job/{jobs["ship"].pk}/change/">ship</a> (waiting)' in text

    def test_at_most_twenty_of_each(self, admin_client: Client) -> None:
        flow = workflow("fan")
        root = flow.add("tests.step", {}, name="root")
        for index in range(30):
            flow.add("tests.step", {}, name=f"leaf-{index}", after=[root])
        jobs = flow.enqueue().jobs
        text = admin_client.get(f"/admin/pgoutbox/job/{jobs['root'].pk}/change/").content.decode()
        assert len(re.findall(r">leaf-\d+</a>", text)) == 20
        assert "and more" in text

    def test_a_plain_job_has_no_workflow_section(self, admin_client: Client) -> None:
        from django_pgoutbox import enqueue

        job = enqueue("tests.step", {})
        text = admin_client.get(f"/admin/pgoutbox/job/{job.pk}/change/").content.decode()
        assert "Waited for by" not in text
        assert "Waits for" not in text


class TestHostile:
    def test_a_circle_written_by_hand_is_drawn_and_named_not_followed_forever(
        self, admin_client: Client
    ) -> None:
        wf, jobs = order()
        # notify -> reserve closes a circle: reserve, charge, ship, notify wait for each other
        JobDependency.objects.create(parent_id=jobs["notify"].pk, child_id=jobs["reserve"].pk)
        JobDependency.objects.create(parent_id=jobs["ship"].pk, child_id=jobs["ship"].pk)
        page = admin_client.get(page_of(wf.pk))
        assert page.status_code == 200
        text = page.content.decode()
        assert "4 steps wait for each other in a circle" in text
        svg = text[
            text.index('<svg id="workflow-graph"') : text.index(
                "</svg>", text.index('<svg id="workflow-graph"')
            )
        ]
        assert svg.count('class="step ') == 4

    def test_a_step_deleted_by_retention_is_left_out_and_counted(
        self, admin_client: Client
    ) -> None:
        wf, jobs = order()
        end(jobs["reserve"], JobStatus.COMPLETED)
        Job.objects.filter(pk=jobs["reserve"].pk).delete()
        text = admin_client.get(page_of(wf.pk)).content.decode()
        assert "1 step that others waited for is no longer kept" in text
        charge = admin_client.get(f"/admin/pgoutbox/job/{jobs['charge'].pk}/change/")
        assert f"<li>{jobs['reserve'].pk} (no longer kept)</li>" in charge.content.decode()

    def test_a_huge_name_is_cut_in_the_graph_and_whole_in_its_title(
        self, admin_client: Client
    ) -> None:
        flow = workflow("w" * 200)
        flow.add("tests.step", {}, name="n" * 200)
        wf = flow.enqueue().workflow
        text = admin_client.get(page_of(wf.pk)).content.decode()
        svg = text[
            text.index('<svg id="workflow-graph"') : text.index(
                "</svg>", text.index('<svg id="workflow-graph"')
            )
        ]
        assert "n" * (graph.NAME_CHARS - 1) + "…" in svg
        assert "n" * 200 in svg  # in the box's title

    def test_a_cancel_after_another_cancels_nothing_more(self, admin_client: Client) -> None:
        wf, jobs = order()
        url = f"{LIST}{wf.pk}/cancel/"
        admin_client.get(url)  # two operators open the confirmation
        admin_client.post(url, {"confirmed": "yes"})
        page = admin_client.post(url, {"confirmed": "yes"}, follow=True)
        assert page.status_code == 200
        assert set(statuses(jobs).values()) == {"cancelled"}

    def test_a_step_of_no_name_and_unknown_status_still_draws(self, admin_client: Client) -> None:
        wf, jobs = order()
        with connection.cursor() as cursor:
            cursor.execute("UPDATE jobs SET step = NULL WHERE id = %s", [jobs["ship"].pk])
        text = admin_client.get(page_of(wf.pk)).content.decode()
        assert str(jobs["ship"].pk)[: graph.NAME_CHARS - 1] in text

    def test_more_steps_and_edges_than_a_page_reads(
        self, admin_client: Client, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A page reads the first READ_STEPS steps and READ_EDGES edges (10,000 and 50,000):
        edges to steps past them are left out, and the page says so."""
        monkeypatch.setattr(workflow_pages, "READ_STEPS", 50)
        monkeypatch.setattr(workflow_pages, "READ_EDGES", 60)
        wf = random_dag(80, seed=5)
        page = admin_client.get(page_of(wf.pk))
        assert page.status_code == 200
        text = page.content.decode()
        assert "more than 50 steps" in text
        assert "more than 60 edges" in text
        # counted apart, all 80 of them
        pending = Job.objects.filter(workflow_id=wf.pk, status=JobStatus.PENDING).count()
        assert f"Steps: {pending} pending, {80 - pending} waiting." in text
        svg = text[text.index('<svg id="workflow-graph"') :]
        assert svg.count('class="step ') == 50


class TestTheLayout:
    """The layout alone: no database, no request."""

    def test_each_layer_is_the_longest_path_from_a_root(self) -> None:
        found = graph.layers(["a", "b", "c", "d"], [("a", "b"), ("b", "c"), ("a", "c"), ("a", "d")])
        assert found.layer_of == {"a": 0, "b": 1, "c": 2, "d": 1}
        assert not found.circular

    def test_a_circle_ends_in_a_last_layer_of_its_own(self) -> None:
        found = graph.layers(["a", "b", "c"], [("a", "b"), ("b", "c"), ("c", "b")])
        assert found.circular == {"b", "c"}
        assert found.layer_of == {"a": 0, "b": 1, "c": 1}

    def test_the_barycenter_pass_uncrosses_a_simple_pair(self) -> None:
        steps = ["a", "b", "y", "x"]
        edges = [("a", "x"), ("b", "y")]
        found = graph.layers(steps, edges)
        columns = graph.ordered_columns(steps, found, edges)
        assert columns == [["a", "b"], ["x", "y"]]
