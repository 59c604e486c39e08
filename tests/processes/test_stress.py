"""``./run stress``: rounds with seeds, failures reported with the seed, the same order again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import stress
from tests.processes import ROOT

SOMETIMES_FAILING = """
import os

def test_passes():
    pass

def test_fails_on_odd_seeds():
    assert int(os.environ["PGOUTBOX_TEST_SEED"]) % 2 == 0, "an odd seed"
"""


def test_rounds_report_each_failure_with_its_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = tmp_path / "test_sometimes.py"
    module.write_text(SOMETIMES_FAILING)
    code = stress.main(
        ["--rounds", "3", "--clean", "5", "--load", "python", "--seed", "10", str(module)]
    )
    printed = capsys.readouterr().out
    assert code == 1
    assert "== round 1, seed 10: clean" in printed
    assert "== round 2, seed 11: 1 failed" in printed
    assert "== round 3, seed 12: clean" in printed
    assert "round 2 seed 11: " in printed
    assert "test_fails_on_odd_seeds" in printed
    assert "an odd seed" in printed
    kept = ROOT / ".stress-round-2-seed-11.txt"
    assert kept.exists()
    kept.unlink()


def test_it_stops_after_enough_clean_rounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = tmp_path / "test_clean.py"
    module.write_text("def test_passes():\n    pass\n")
    assert stress.main(["--rounds", "9", "--clean", "2", "--load", "none", str(module)]) == 0
    printed = capsys.readouterr().out
    assert "== 2 rounds, 2 clean in a row at the end" in printed


def test_a_seed_gives_the_same_order_and_another_seed_another() -> None:
    def order(seed: str) -> list[str]:
        listed = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
             "tests/unit/test_retry.py", "tests/unit/test_cron.py"],
            cwd=ROOT, env={**os.environ, "PGOUTBOX_TEST_SEED": seed},
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return [line for line in listed.splitlines() if "::" in line]

    first = order("1")
    assert order("1") == first
    assert order("2") != first
    assert sorted(order("2")) == sorted(first)  # the same tests, in another order
