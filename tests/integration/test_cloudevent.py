"""``OutboxEvent.as_cloudevent()``: an event in CloudEvents 1.0's JSON format."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime

import pytest

from django_pgoutbox import publish
from django_pgoutbox.models import OutboxEvent

pytestmark = pytest.mark.django_db(transaction=True)

#: CloudEvents 1.0: attribute names are lower-case ASCII letters and digits (20 at most is
#: what the specification asks producers to keep to).
ATTRIBUTE_NAME = re.compile(r"^[a-z0-9]{1,20}$")
REQUIRED = {"specversion", "id", "source", "type"}


def order_placed(**extra: object) -> OutboxEvent:
    return publish(
        "order.placed",
        aggregate_type="order",
        aggregate_id=uuid.UUID("018f0000-0000-7000-8000-000000000001"),
        payload={"total": "12.50", "lines": [{"sku": "A1", "qty": 2}], "note": "café"},
        schema_version=2,
        **extra,  # type: ignore[arg-type]
    )


def test_an_event_as_a_cloudevent() -> None:
    event = order_placed()
    cloud = event.as_cloudevent()
    assert set(cloud) >= REQUIRED
    assert all(ATTRIBUTE_NAME.match(name) for name in cloud)
    assert cloud["specversion"] == "1.0"
    assert cloud["id"] == str(event.id)
    assert cloud["source"] == "/order"
    assert cloud["type"] == "order.placed"
    assert cloud["subject"] == "018f0000-0000-7000-8000-000000000001"
    assert cloud["datacontenttype"] == "application/json"
    assert cloud["aggregatetype"] == "order"
    assert cloud["schemaversion"] == 2
    assert "organizationid" not in cloud
    assert "dataschema" not in cloud
    assert cloud["data"] == {"total": "12.50", "lines": [{"sku": "A1", "qty": 2}], "note": "café"}
    # RFC 3339, in UTC, the moment the database gave the event.
    assert cloud["time"].endswith("Z")
    parsed = datetime.fromisoformat(cloud["time"].replace("Z", "+00:00"))
    assert parsed == event.occurred_at
    assert json.loads(json.dumps(cloud)) == cloud


def test_read_back_from_the_table_it_is_the_same() -> None:
    event = order_placed(organization_id=uuid.UUID(int=7))
    stored = OutboxEvent.objects.get(pk=event.id)
    assert stored.as_cloudevent() == event.as_cloudevent()
    assert stored.as_cloudevent()["organizationid"] == str(uuid.UUID(int=7))


def test_source_and_dataschema_given() -> None:
    cloud = order_placed().as_cloudevent(
        source="https://shop.example.com/orders",
        dataschema="https://shop.example.com/schemas/order.placed/2.json",
    )
    assert cloud["source"] == "https://shop.example.com/orders"
    assert cloud["dataschema"] == "https://shop.example.com/schemas/order.placed/2.json"


@pytest.mark.parametrize("source", ["", "   ", 5])
def test_a_source_that_is_no_uri_reference_is_refused(source: object) -> None:
    with pytest.raises(ValueError, match="source must be a non-empty URI reference"):
        order_placed().as_cloudevent(source=source)  # type: ignore[arg-type]


def test_an_event_not_written_yet_is_refused() -> None:
    event = OutboxEvent(
        aggregate_type="order",
        aggregate_id=uuid.uuid4(),
        event_type="order.placed",
        schema_version=1,
        payload={},
    )
    with pytest.raises(ValueError, match="has no occurred_at"):
        event.as_cloudevent()


def test_a_time_in_another_zone_is_given_in_utc() -> None:
    event = order_placed()
    event.occurred_at = datetime(2026, 12, 3, 17, 30, tzinfo=UTC).astimezone()
    assert event.as_cloudevent()["time"] == "2026-12-03T17:30:00Z"
