"""The pytest plugin of ``django_pgoutbox.testing``: the ``pgoutbox`` fixture.

Registered under ``[project.entry-points.pytest11]``, so pytest loads it in every project where
django-pgoutbox is installed. It imports nothing of Django's or of the package's models here
(pytest loads plugins before Django's settings are configured), and a project that asks for no
``pgoutbox`` fixture sees nothing of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from django_pgoutbox.testing.bound import Testing


@pytest.fixture
def pgoutbox(request: pytest.FixtureRequest) -> Testing:
    """``django_pgoutbox.testing``'s helpers, bound to the test's database (``Testing``).

    It gives the test database access as pytest-django's ``db`` fixture does, unless the test
    asks for ``transactional_db`` (or ``live_server``), or its ``django_db`` mark does: then
    statements commit and handlers run outside any transaction, as in a worker. ``.on(alias)``
    gives the helpers of another database the test's mark names (``databases=[...]``).
    """
    if not {"transactional_db", "live_server"} & set(request.fixturenames):
        try:
            request.getfixturevalue("db")
        except pytest.FixtureLookupError as error:
            if error.argname != "db":
                raise
            pytest.fail(
                "the pgoutbox fixture needs pytest-django, for its test database (its db "
                "fixture); install it, or use the functions of django_pgoutbox.testing in a "
                "django.test.TestCase",
                pytrace=False,
            )
    from django_pgoutbox.testing.bound import Testing

    return Testing()
