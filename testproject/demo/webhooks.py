"""The webhook view of docs/howto/webhooks-in.md, as the page has it (a test compares them), for
the tests that drive it through Django's test client (tests/integration/test_inbox.py)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_pgoutbox import accept_message, publish

#: A signature older than this (seconds) is refused, so that a captured request cannot be replayed.
TOLERANCE = 300


def stripe_signature_ok(body: bytes, header: str, secret: str) -> bool:
    """Whether ``header`` (Stripe-Signature) signs ``body`` with ``secret``, recently enough."""
    timestamp, signatures = None, []
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        if key == "t" and value.isdigit():
            timestamp = int(value)
        elif key == "v1":
            signatures.append(value)
    if timestamp is None or abs(time.time() - timestamp) > TOLERANCE:
        return False
    signed = f"{timestamp}.".encode() + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    # compare_digest takes as long for a wrong signature as for a right one
    return any(hmac.compare_digest(expected, candidate) for candidate in signatures)


@csrf_exempt  # the signature, not a CSRF token, proves where the request comes from
@require_POST
def stripe_webhook(request: HttpRequest) -> HttpResponse:
    header = request.headers.get("Stripe-Signature", "")
    if not stripe_signature_ok(request.body, header, settings.STRIPE_WEBHOOK_SECRET):
        return HttpResponseBadRequest("bad signature")
    try:
        event = json.loads(request.body)
        event_id, event_type = event["id"], event["type"]
        session = event["data"]["object"]
    except (ValueError, KeyError, TypeError):
        return HttpResponseBadRequest("not an event")
    if not isinstance(event_id, str) or not event_id:
        return HttpResponseBadRequest("no event id")

    with transaction.atomic():
        if accept_message("stripe", event_id) and event_type == "checkout.session.completed":
            # client_reference_id: the order's id, which the checkout was created with
            publish(
                "order.paid",
                aggregate_type="order",
                aggregate_id=uuid.UUID(session["client_reference_id"]),
                payload={"stripe_event": event_id, "amount": session["amount_total"]},
            )
    return HttpResponse(status=200)
