"""The ``PGOUTBOX`` settings dict, merged over documented defaults, typed and validated.

Every value is read through :func:`get_settings`, which parses ``settings.PGOUTBOX`` once and
caches the result until Django's ``setting_changed`` signal says it changed (as
``override_settings`` does). Parsing collects every problem instead of stopping at the first, so
that one ``manage.py check`` run names them all. :mod:`django_pgoutbox.checks` turns them into
system check errors, and :func:`get_settings` raises ``ImproperlyConfigured`` if code runs with a
broken configuration anyway.
"""

from __future__ import annotations

import functools
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_pgoutbox.conf.parse import parse_settings
from django_pgoutbox.conf.values import (
    CANCEL_CHANNEL,
    CONTROL_CHANNEL,
    DEFAULTS,
    JOBS_CHANNEL,
    LIMIT_BY_CHOICES,
    MAX_ASYNC_CONCURRENCY,
    MAX_CONCURRENCY,
    MAX_DELAY_CEILING,
    MAX_INT32,
    MAX_RETENTION,
    MIN_LEASE_SECONDS,
    MIN_TOKEN_LENGTH,
    OUTBOX_CHANNEL,
    QUEUE_KEYS,
    QUEUE_NAME_RE,
    QUEUE_ONLY_DEFAULTS,
    RESULTS_CHANNEL,
    SETTING_NAME,
    OutboxSettings,
    PgOutboxSettings,
    PriorityAging,
    QueueSettings,
    RetentionSettings,
    RetrySettings,
    SettingsProblem,
    ViewsAuthSettings,
)

__all__ = [
    "CANCEL_CHANNEL",
    "CONTROL_CHANNEL",
    "DEFAULTS",
    "JOBS_CHANNEL",
    "LIMIT_BY_CHOICES",
    "MAX_ASYNC_CONCURRENCY",
    "MAX_CONCURRENCY",
    "MAX_DELAY_CEILING",
    "MAX_INT32",
    "MAX_RETENTION",
    "MIN_LEASE_SECONDS",
    "MIN_TOKEN_LENGTH",
    "OUTBOX_CHANNEL",
    "QUEUE_KEYS",
    "QUEUE_NAME_RE",
    "QUEUE_ONLY_DEFAULTS",
    "RESULTS_CHANNEL",
    "SETTING_NAME",
    "OutboxSettings",
    "PgOutboxSettings",
    "PriorityAging",
    "QueueSettings",
    "RetentionSettings",
    "RetrySettings",
    "SettingsProblem",
    "ViewsAuthSettings",
    "get_settings",
    "parse_settings",
    "settings_problems",
]


@functools.cache
def _cached() -> tuple[PgOutboxSettings, tuple[SettingsProblem, ...]]:
    parsed, problems = parse_settings(getattr(settings, SETTING_NAME, None))
    return parsed, tuple(problems)


def settings_problems() -> tuple[SettingsProblem, ...]:
    """What is wrong with the current ``PGOUTBOX`` (empty when it is valid)."""
    return _cached()[1]


def get_settings() -> PgOutboxSettings:
    """The parsed ``PGOUTBOX``; raises ``ImproperlyConfigured`` naming every bad key."""
    parsed, problems = _cached()
    if problems:
        raise ImproperlyConfigured(
            "Invalid PGOUTBOX setting:\n" + "\n".join(f"  - {p}" for p in problems)
        )
    return parsed


@receiver(setting_changed)
def _reset_on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        _cached.cache_clear()
