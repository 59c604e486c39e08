"""The process and reliability tests, round after round, beside a CPU and disk load.

``./run stress`` runs this module.

Each round runs the chosen tests (by default ``STRESSED``: the tests of real worker, relay and
scheduler processes, and the reliability suite) with its own seed: ``PGOUTBOX_TEST_SEED`` orders
the tests (``tests/conftest.py``) and drives their random choices (the chaos test's faults), so a
failure reported with its seed can be run again in the same order. Beside each round runs
``stress-ng`` (Debian's) on every core and on the disk, or, where it is missing, as many busy
Python processes and a disk writer. It stops after ``--clean`` rounds in a row without a
failure, or after ``--rounds``; it exits 1 if any round failed. Examples::

    ./run stress                          # until 5 clean rounds in a row, at most 20 rounds
    ./run stress --rounds 3 --load none   # the same tests, three times, without the load
    ./run stress -- tests/processes/test_worker_processes.py -k sigkill

One failure, run alone again: ``PGOUTBOX_TEST_SEED=<seed> ./run pytest <the round's tests>``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The tests that start real processes, kill them, or race them: where a busy machine shows.
STRESSED = [
    "tests/processes/test_worker_processes.py",
    "tests/processes/test_outbox_processes.py",
    "tests/processes/test_scheduler_processes.py",
    "tests/processes/test_control.py",
    "tests/processes/test_databases.py",
    "tests/processes/test_limits.py",
    "tests/integration/test_worker.py",
    "tests/processes/reliability",
]


@dataclass(frozen=True)
class Failure:
    round: int
    seed: int
    test: str
    message: str


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="./run stress", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20, help="at most this many rounds (20)")
    parser.add_argument(
        "--clean", type=int, default=5, help="stop after this many clean rounds in a row (5)"
    )
    parser.add_argument(
        "--load",
        choices=["stress-ng", "python", "none"],
        default="stress-ng" if shutil.which("stress-ng") else "python",
        help="what runs beside the tests (stress-ng where installed, else busy Python processes)",
    )
    parser.add_argument("--seed", type=int, help="the first round's seed (then seed + 1, ...)")
    parser.add_argument(
        "--time-scale",
        default=os.environ.get("PGOUTBOX_TEST_TIME_SCALE", "2"),
        help="PGOUTBOX_TEST_TIME_SCALE for the rounds (default: as set, else 2, as in CI)",
    )
    parser.add_argument("pytest_args", nargs="*", help="tests and pytest options (after --)")
    options = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    # Started in the background by a shell without job control, SIGINT is ignored, and so it
    # would be in each round's pytest, which could then not be stopped through its teardown.
    # A handler (unlike "ignored") is reset to the default when a child starts.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    tests = options.pytest_args or STRESSED
    first_seed = options.seed if options.seed is not None else random.randrange(1, 10**6)
    failures: list[Failure] = []
    clean_in_a_row = 0
    for number in range(1, options.rounds + 1):
        seed = first_seed + number - 1
        with load(options.load):
            started = time.monotonic()
            found = run_round(number, seed, tests, options.time_scale)
        seconds = time.monotonic() - started
        failures += found
        clean_in_a_row = 0 if found else clean_in_a_row + 1
        verdict = f"{len(found)} failed" if found else "clean"
        print(f"== round {number}, seed {seed}: {verdict} in {seconds:.0f} s", flush=True)
        for failure in found:
            print(f"   FAILED {failure.test}: {failure.message}", flush=True)
        if clean_in_a_row >= options.clean:
            break
    print(f"\n== {number} rounds, {clean_in_a_row} clean in a row at the end, load {options.load}")
    for failure in failures:
        print(f"round {failure.round} seed {failure.seed}: {failure.test}\n    {failure.message}")
    if failures:
        print(
            "\nRun one again: PGOUTBOX_TEST_SEED=<seed> "
            f"PGOUTBOX_TEST_TIME_SCALE={options.time_scale} ./run pytest {' '.join(tests)}"
        )
    return 1 if failures else 0


def run_round(number: int, seed: int, tests: list[str], time_scale: str) -> list[Failure]:
    """One run of pytest over ``tests``; the failures its JUnit report lists."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.xml"
        log = Path(scratch) / "output.txt"
        env = {
            **os.environ,
            "PGOUTBOX_TEST_SEED": str(seed),
            "PGOUTBOX_TEST_TIME_SCALE": time_scale,
        }
        with log.open("w") as output:
            pytest = subprocess.Popen(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 f"--junitxml={report}", *tests],
                cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            try:
                code = pytest.wait()
            finally:
                # Stopped early (Ctrl-C, SIGTERM): the round's pytest goes too, through its
                # teardown (SIGINT), which stops the worker processes it started; else they
                # would go on using the round's database.
                if pytest.poll() is None:
                    os.killpg(pytest.pid, signal.SIGINT)
                    try:
                        pytest.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        os.killpg(pytest.pid, signal.SIGKILL)
                        pytest.wait()
        failures = list(failed_tests(report, number, seed)) if report.exists() else []
        if code not in (0, 1) or (code == 1 and not failures):
            tail = log.read_text().strip().splitlines()[-15:]
            failures.append(Failure(number, seed, "(pytest)", f"exit {code}: " + " | ".join(tail)))
        if failures:
            kept = ROOT / f".stress-round-{number}-seed-{seed}.txt"
            shutil.copyfile(log, kept)
            print(f"   output kept in {kept.name}", flush=True)
        return failures


def failed_tests(report: Path, number: int, seed: int) -> Iterator[Failure]:
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        for problem in [*case.iter("failure"), *case.iter("error")]:
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            message = (problem.get("message") or problem.text or "").strip().splitlines()
            yield Failure(number, seed, test, message[0][:300] if message else "")


@contextlib.contextmanager
def load(kind: str) -> Iterator[None]:
    """CPU and disk load on every core while the block runs."""
    cores = os.cpu_count() or 1
    scratch = tempfile.mkdtemp(prefix="pgoutbox-stress-")
    if kind == "stress-ng":
        commands = [
            ["stress-ng", "--quiet", "--temp-path", scratch, "--cpu", str(cores),
             "--hdd", "1", "--hdd-bytes", "256M", "--io", "1"],
        ]  # fmt: skip
    elif kind == "python":
        busy = "while True: pass"
        writer = (
            "import os, sys\n"
            "block = os.urandom(1 << 20)\n"
            "while True:\n"
            "    with open(os.path.join(sys.argv[1], 'load'), 'wb') as f:\n"
            "        for _ in range(64):\n"
            "            f.write(block)\n"
            "        f.flush()\n"
            "        os.fsync(f.fileno())\n"
        )
        commands = [[sys.executable, "-c", busy] for _ in range(cores)]
        commands.append([sys.executable, "-c", writer, scratch])
    else:
        commands = []
    processes = [
        subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL)
        for command in commands
    ]
    try:
        yield
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
