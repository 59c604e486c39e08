"""The pytest plugin in a project's test run without pytest-django: the ``pgoutbox`` fixture
says what it needs, rather than that a fixture ``db`` was not found."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_fixture_without_pytest_django_says_what_it_needs(tmp_path: Path) -> None:
    (tmp_path / "test_users.py").write_text(
        "def test_uses_the_fixture(pgoutbox):\n    pgoutbox.refute_enqueued()\n\n\n"
        "def test_without_it():\n    pass\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # no pytest-django
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "django_pgoutbox.testing.pytest_plugin",
            "-p",
            "no:cacheprovider",
            "-q",
            str(tmp_path / "test_users.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert "1 passed, 1 error" in output, output
    assert "the pgoutbox fixture needs pytest-django" in output, output
    assert "fixture 'db' not found" not in output, output
