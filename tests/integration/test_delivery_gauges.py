"""The subscribers' undelivered deliveries, observed: the gauges (per subscriber: waiting,
failing, dead, lag, abandoned), their Prometheus series, the health report's warnings and the
events' ``delivering`` state. Every delivery is a real row of ``outbox_deliveries``, written as
the relay would leave it; hostile ones (a 10 KB name, a name with newlines, a name no code
registers) as a hand or another deployment would."""

from __future__ import annotations

import io
import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_pgoutbox import gauges, metrics, publish, queries, subscriber
from django_pgoutbox.event_states import EVENT_STATES
from django_pgoutbox.health import Heartbeat, health_report
from django_pgoutbox.models import OutboxDelivery, OutboxEvent
from django_pgoutbox.prometheus import database_exposition

pytestmark = pytest.mark.django_db

ALPHA = "tests.observed.alpha"
BETA = "tests.observed.beta"
EVENTS = "/admin/pgoutbox/outboxevent/"


@pytest.fixture
def observed(registry: None) -> None:
    """Two registered subscribers of ``tests.observed``."""

    @subscriber("tests.observed", name=ALPHA)
    def alpha(event: OutboxEvent) -> None:
        pass

    @subscriber("tests.observed", name=BETA)
    def beta(event: OutboxEvent) -> None:
        pass


def ago(seconds: float) -> Any:
    return timezone.now() - timedelta(seconds=seconds)


def delivery(
    name: str,
    aggregate: uuid.UUID | None = None,
    *,
    occurred: float = 0,
    available: float = 0,
    error: str | None = None,
    dead: bool = False,
    delivered: bool = False,
    claimed: float | None = None,
) -> OutboxDelivery:
    """A processed event of ``aggregate`` and ``name``'s delivery of it (times in seconds ago)."""
    event = publish(
        "tests.observed", aggregate_type="o", aggregate_id=aggregate or uuid.uuid4(), payload={}
    )
    OutboxEvent.objects.filter(pk=event.pk).update(
        occurred_at=ago(occurred), available_at=ago(occurred), processed_at=ago(occurred)
    )
    return OutboxDelivery.objects.create(
        event_id=event.pk,
        subscriber=name,
        aggregate_type="o",
        aggregate_id=event.aggregate_id,
        occurred_at=ago(occurred),
        created_at=timezone.now(),  # in the order written, as the relay's transactions
        available_at=ago(available),
        attempts=1 if error else 0,
        last_error=error,
        last_error_code="RuntimeError" if error else None,
        dead_at=ago(0) if dead else None,
        delivered_at=ago(0) if delivered else None,
        claimed_at=None if claimed is None else ago(claimed),
        claimed_by=None if claimed is None else "relay-1",
    )


@pytest.fixture
def states(observed: None) -> dict[str, OutboxDelivery]:
    """ALPHA's deliveries in each state, on the default OVERDUE_SECONDS (300); none of BETA."""
    a, b = uuid.uuid4(), uuid.uuid4()
    return {
        # Dead, and one held back behind it: neither is abandoned.
        "dead": delivery(ALPHA, a, occurred=800, available=800, error="gave up", dead=True),
        "behind_dead": delivery(ALPHA, a, occurred=790, available=790),
        # Failed, its back-off over 400 s ago, and no relay retried it: abandoned.
        "abandoned": delivery(ALPHA, occurred=700, available=400, error="boom"),
        # Failed, backing off: not due.
        "backing_off": delivery(ALPHA, occurred=600, available=-60, error="boom"),
        # Due for long, but a relay claimed it 10 s ago.
        "claimed": delivery(ALPHA, occurred=500, available=500, claimed=10),
        # Due, written a moment ago: not overdue.
        "new": delivery(ALPHA, b, occurred=20, available=10),
        # Delivered: not counted anywhere.
        "delivered": delivery(ALPHA, occurred=5000, available=5000, delivered=True),
    }


def families() -> dict[str, Any]:
    text = database_exposition().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def series(name: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(value for key, value in sorted(s.labels.items())): s.value
        for s in families()[name].samples
    }


class TestGauges:
    def test_no_delivery_is_zeros_for_every_registered_subscriber(self, observed: None) -> None:
        deliveries = gauges.database_gauges().deliveries
        assert deliveries[ALPHA] == gauges.SubscriberGauges(ALPHA)
        assert deliveries[BETA] == gauges.SubscriberGauges(BETA)
        assert metrics.UNREGISTERED not in deliveries
        assert gauges.delivery_gauges() == deliveries
        counts = series("pgoutbox_outbox_deliveries_undelivered")
        for name in (ALPHA, BETA):
            for state in ("waiting", "failing", "dead"):
                assert counts[(state, name)] == 0
            assert series("pgoutbox_outbox_delivery_lag_seconds")[(name,)] == 0
            assert series("pgoutbox_outbox_deliveries_abandoned")[(name,)] == 0
        assert not [k for k in counts if k[1] == metrics.UNREGISTERED]

    def test_each_state_per_subscriber(self, states: dict[str, OutboxDelivery]) -> None:
        alpha = gauges.database_gauges().deliveries[ALPHA]
        assert (alpha.waiting, alpha.failing, alpha.dead, alpha.abandoned) == (3, 2, 1, 1)
        assert alpha.estimated == ()
        assert 780 < alpha.lag < 900  # the one held back behind the dead one: 790 s
        assert 390 < alpha.abandoned_age < 480
        assert gauges.database_gauges().deliveries[BETA] == gauges.SubscriberGauges(BETA)
        counts = series("pgoutbox_outbox_deliveries_undelivered")
        assert (counts[("waiting", ALPHA)], counts[("failing", ALPHA)]) == (3, 2)
        assert counts[("dead", ALPHA)] == 1
        assert series("pgoutbox_outbox_deliveries_abandoned")[(ALPHA,)] == 1
        assert 780 < series("pgoutbox_outbox_delivery_lag_seconds")[(ALPHA,)] < 900

    def test_the_dead_do_not_count_in_the_lag(self, observed: None) -> None:
        delivery(ALPHA, occurred=9000, available=9000, error="gave up", dead=True)
        assert gauges.delivery_gauges()[ALPHA].lag == 0
        delivery(ALPHA, occurred=60, available=60)
        assert 55 < gauges.delivery_gauges()[ALPHA].lag < 200

    def test_a_longer_threshold_abandons_nothing(
        self, settings: Any, states: dict[str, OutboxDelivery]
    ) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, "OUTBOX": {"OVERDUE_SECONDS": 3600}}
        alpha = gauges.delivery_gauges()[ALPHA]
        assert (alpha.abandoned, alpha.abandoned_age) == (0, 0.0)
        assert not [w for w in gauges.delivery_warnings({ALPHA: alpha}) if "claimed" in w]

    def test_counts_stop_at_the_limit(
        self, observed: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(gauges, "EXACT_COUNT", 3)
        for _ in range(3):
            delivery(ALPHA, occurred=30, available=30)
        assert gauges.delivery_gauges()[ALPHA].estimated == ()
        for _ in range(3):
            delivery(ALPHA, occurred=30, available=30, error="boom")
        alpha = gauges.delivery_gauges()[ALPHA]
        assert alpha.estimated  # lower bounds: the first four written were read
        assert alpha.undelivered == 4
        assert (alpha.waiting, alpha.failing) == (3, 1)

    def test_the_abandoned_rule_is_the_claims(self) -> None:
        """A delivery is abandoned only if the relay's claim would take it: the same 'first of
        its aggregate and subscriber' condition, one text."""
        from django_pgoutbox.queries.deliveries import heads_its_subscriber_aggregate

        assert heads_its_subscriber_aggregate("d") in queries.CLAIM_DELIVERIES
        assert heads_its_subscriber_aggregate("w") in queries.DELIVERY_GAUGES


def test_no_family_of_the_view_shares_a_name(observed: None) -> None:
    """The gauges of undelivered deliveries are not named ``pgoutbox_outbox_deliveries``: the
    counter ``pgoutbox_outbox_deliveries_total`` of the same exposition is that family already,
    and Prometheus refuses a second TYPE line for one name."""
    metrics.DELIVERIES.inc(subscriber=ALPHA, outcome="delivered")
    text = database_exposition().decode()
    typed = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(typed) == len(set(typed)), sorted(typed)
    assert "pgoutbox_outbox_deliveries_undelivered" in typed


class TestNamesFromRows:
    def test_unregistered_names_are_summed(self, observed: None) -> None:
        delivery("gone.subscriber", occurred=100, available=100, error="boom")
        delivery("gone.other", occurred=50, available=50, dead=True, error="gave up")
        delivery("gone.other", occurred=40, available=40)
        other = gauges.database_gauges().deliveries[metrics.UNREGISTERED]
        assert (other.waiting, other.failing, other.dead, other.estimated) == (1, 1, 1, ())
        assert 95 < other.lag < 200
        text = database_exposition().decode()
        assert "gone" not in text
        counts = series("pgoutbox_outbox_deliveries_undelivered")
        assert counts[("dead", metrics.UNREGISTERED)] == 1
        assert counts[("waiting", ALPHA)] == 0

    def test_more_unregistered_names_than_read_make_a_lower_bound(
        self, observed: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(gauges, "MAX_UNREGISTERED_SUBSCRIBERS", 1)
        delivery("gone.a", dead=True, error="gave up")
        delivery("gone.b", dead=True, error="gave up")
        other = gauges.delivery_gauges()[metrics.UNREGISTERED]
        assert other.dead == 1  # gone.a alone was read
        assert "dead" in other.estimated
        (warning,) = gauges.delivery_warnings({metrics.UNREGISTERED: other})
        assert warning.startswith("subscribers that no process here registers: at least 1 dead")

    def test_a_10_kb_name_and_newlines_break_nothing(self, observed: None) -> None:
        for name in ("x" * 10_000, 'evil"}\nfake_metric{a="b"} 1\n# HELP x', "é\\\n" * 3000):
            delivery(name, occurred=30, available=30, dead=True, error="gave up")
        text = database_exposition().decode()
        assert max(len(line) for line in text.splitlines()) < 400
        assert "fake_metric" not in text
        counts = series("pgoutbox_outbox_deliveries_undelivered")  # the parser reads every line
        assert counts[("dead", metrics.UNREGISTERED)] == 3
        report = health_report(require=["jobs"])
        assert report.as_dict()["deliveries"][metrics.UNREGISTERED]["dead"] == 3
        assert max(len(w) for w in report.warnings) < 400
        assert "fake_metric" not in json.dumps(report.as_dict())

    def test_a_long_registered_name_is_cut(self, registry: None) -> None:
        long_name = "tests.observed." + "long" * 50

        @subscriber("tests.observed", name=long_name)
        def long_one(event: OutboxEvent) -> None:
            pass

        delivery(long_name, dead=True, error="gave up")
        assert gauges.delivery_gauges()[long_name].dead == 1
        label = metrics.label_value("subscriber", long_name)
        assert len(label) == metrics.MAX_LABEL_LENGTH
        assert series("pgoutbox_outbox_deliveries_undelivered")[("dead", label)] == 1

    def test_a_subscriber_registered_as_unregistered_is_added_to_the_others(
        self, registry: None
    ) -> None:
        @subscriber("tests.observed", name=metrics.UNREGISTERED)
        def named_so(event: OutboxEvent) -> None:
            pass

        delivery(metrics.UNREGISTERED, dead=True, error="gave up")
        delivery("gone.subscriber", dead=True, error="gave up")
        assert gauges.delivery_gauges()[metrics.UNREGISTERED].dead == 2
        assert series("pgoutbox_outbox_deliveries_undelivered")[("dead", metrics.UNREGISTERED)] == 2


class TestHealth:
    @pytest.mark.django_db(transaction=True)
    def test_dead_and_abandoned_deliveries_warn_and_never_make_it_unhealthy(
        self, states: dict[str, OutboxDelivery]
    ) -> None:
        beat = Heartbeat("w-obs", ["jobs", "relay", "scheduler"], ["default"], "default")
        beat.start()
        try:
            report = health_report()
        finally:
            beat.stop()
        assert report.healthy
        shown = report.as_dict()["deliveries"]
        assert {k: shown[ALPHA][k] for k in ("waiting", "failing", "dead", "abandoned")} == {
            "waiting": 3,
            "failing": 2,
            "dead": 1,
            "abandoned": 1,
        }
        assert shown[BETA]["dead"] == 0
        dead, abandoned = [w for w in report.warnings if ALPHA in w]
        assert dead.startswith(f"subscriber {ALPHA!r}: 1 dead outbox delivery(ies)")
        assert abandoned.startswith(f"subscriber {ALPHA!r}: 1 outbox delivery(ies) due for over")
        assert "the oldest untouched for 4" in abandoned
        assert not [w for w in report.warnings if BETA in w]

    def test_the_health_view_and_command_show_them(
        self, admin_client: Any, states: dict[str, OutboxDelivery]
    ) -> None:
        body = admin_client.get("/pgoutbox/health?require=jobs").json()
        assert body["deliveries"][ALPHA]["dead"] == 1
        assert [w for w in body["warnings"] if "dead outbox delivery" in w]
        out = io.StringIO()
        with pytest.raises(SystemExit):
            call_command("pgoutbox", "health", "--require", "jobs", stdout=out)
        assert json.loads(out.getvalue())["deliveries"][ALPHA]["abandoned"] == 1

    def test_stats_json_shows_them(self, states: dict[str, OutboxDelivery]) -> None:
        out = io.StringIO()
        call_command("pgoutbox", "stats", "--json", stdout=out)
        assert json.loads(out.getvalue())["deliveries"][ALPHA]["dead"] == 1

    def test_stats_shows_a_line_per_subscriber_with_deliveries_not_done(
        self, states: dict[str, OutboxDelivery]
    ) -> None:
        out = io.StringIO()
        call_command("pgoutbox", "stats", stdout=out)
        lines = out.getvalue().splitlines()
        mine = [line for line in lines if line.startswith("deliveries ")]
        assert len(mine) == 1, lines  # not BETA's: nothing pending
        assert mine[0].startswith(
            f"deliveries {ALPHA}: 3 waiting, 2 failing, 1 dead, 1 abandoned, lag "
        ), mine
        assert any(line.startswith("WARNING:") and ALPHA in line for line in lines), lines

    def test_stats_says_when_no_delivery_is_pending(self, observed: None) -> None:
        out = io.StringIO()
        call_command("pgoutbox", "stats", stdout=out)
        assert "deliveries: none pending" in out.getvalue().splitlines()


class TestEventStates:
    def test_delivering_until_every_delivery_is_done(
        self, admin_client: Any, states: dict[str, OutboxDelivery]
    ) -> None:
        def chosen(state: str) -> set[uuid.UUID]:
            return set(
                OutboxEvent.objects.filter(EVENT_STATES[state]()).values_list("pk", flat=True)
            )

        undelivered = {d.event_id for name, d in states.items() if name != "delivered"}
        quiet = publish("tests.observed", aggregate_type="o", aggregate_id=uuid.uuid4(), payload={})
        OutboxEvent.objects.filter(pk=quiet.pk).update(processed_at=timezone.now())
        assert chosen("delivering") == undelivered
        assert chosen("processed") == {states["delivered"].event_id, quiet.pk}
        page = admin_client.get(f"{EVENTS}?state=delivering").content.decode()
        assert {e for e in undelivered | {quiet.pk} if f"{e}/change/" in page} == undelivered
        out = io.StringIO()
        call_command("pgoutbox", "events", "list", "--state", "delivering", stdout=out)
        listed = {line.split()[0] for line in out.getvalue().splitlines()[1:]}
        assert listed == {str(e) for e in undelivered}
        OutboxDelivery.objects.update(delivered_at=timezone.now())
        assert not chosen("delivering")
        assert chosen("processed") == undelivered | {states["delivered"].event_id, quiet.pk}


# -- cost ------------------------------------------------------------------------------------------


def _buffers(params: dict[str, Any]) -> tuple[int, str]:
    """Shared buffers DELIVERY_GAUGES touched, and its plan, after GAUGES_PLAN."""
    with connection.cursor() as cursor:
        cursor.execute(queries.GAUGES_PLAN)
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + queries.DELIVERY_GAUGES, params)
        plan = cursor.fetchone()[0]
        cursor.execute("EXPLAIN " + queries.DELIVERY_GAUGES, params)
        text = "\n".join(row[0] for row in cursor.fetchall())
    if isinstance(plan, str):
        plan = json.loads(plan)
    top = plan[0]["Plan"]
    return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"]), text


def _fill(undelivered: int, delivered: int) -> None:
    """Processed events, ``delivered`` delivered deliveries over four subscribers and
    ``undelivered`` of ALPHA's (waiting, failing and dead), all due for an hour; statistics."""
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH e AS (INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, "
            "schema_version, payload, occurred_at, processed_at) SELECT 'o', gen_random_uuid(), "
            "'tests.observed', 1, '{}', now() - interval '2 hours', now() "
            "FROM generate_series(1, %s) RETURNING id, aggregate_id, occurred_at) "
            "INSERT INTO outbox_deliveries (event_id, subscriber, aggregate_type, aggregate_id, "
            "occurred_at, available_at, attempts, delivered_at, dead_at, last_error) "
            "SELECT id, CASE WHEN n <= %s THEN %s ELSE 'tests.s' || n %% 4 END, 'o', "
            "aggregate_id, occurred_at, now() - interval '1 hour', 1, "
            "CASE WHEN n > %s THEN now() END, CASE WHEN n <= %s AND n %% 10 = 0 THEN now() END, "
            "CASE WHEN n <= %s AND n %% 3 = 0 THEN 'boom' END "
            "FROM (SELECT *, row_number() OVER () AS n FROM e) numbered",
            [undelivered + delivered, undelivered, ALPHA, undelivered, undelivered, undelivered],
        )
        cursor.execute("ANALYZE outbox_events")
        cursor.execute("ANALYZE outbox_deliveries")


def test_a_scrape_reads_as_much_at_any_size(observed: None) -> None:
    """DELIVERY_GAUGES touches about as many buffers with ten times the undelivered deliveries,
    and none of the delivered ones: each subscriber's read stops at its limit."""
    from django_pgoutbox.outbox import subscriber_names

    names = subscriber_names()
    params = {
        "subscribers": names,
        "limit": gauges.EXACT_COUNT + 1,
        "overdue": 300.0,
        "probes": len(names) + gauges.MAX_UNREGISTERED_SUBSCRIBERS + 1,
        "unregistered": gauges.MAX_UNREGISTERED_SUBSCRIBERS,
    }
    _fill(undelivered=3_000, delivered=20_000)
    small, plan = _buffers(params)
    assert "Seq Scan on outbox_deliveries" not in plan, plan
    assert "Bitmap" not in plan, plan
    _fill(undelivered=27_000, delivered=180_000)  # 30,000 undelivered and 200,000 delivered
    large, plan = _buffers(params)
    assert "Seq Scan on outbox_deliveries" not in plan, plan
    assert large <= small * 1.25 + 20, (small, large)
    alpha = gauges.delivery_gauges()[ALPHA]
    assert alpha.estimated
    assert alpha.undelivered == gauges.EXACT_COUNT + 1
    assert alpha.abandoned > 0
