"""Offer ``tests.once`` jobs at a fixed rate until SIGTERM, writing each acknowledged job's id.

    DATABASE_URL=... python -m tests.reliability.horizon_producer RATE IDS_FILE

Run by ``test_horizon.py`` as a process of its own, so that its enqueues (the package's
``enqueue_many``, each batch its own transaction with its notification) do not share the test's
interpreter with the sampling. Every 20 ms it enqueues what is due since it began (catching up
after a slow turn); an id is written once ``enqueue_many`` returned, that is once it committed.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from types import FrameType


def main(rate: float, path: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django_pgoutbox import enqueue_many

    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    offered = 0
    began = time.monotonic()
    with open(path, "w") as ids:
        while not stopping:
            due = int((time.monotonic() - began) * rate) - offered
            if due > 0:
                jobs = enqueue_many([{"job_type": "tests.once", "payload": {}}] * due)
                ids.write("".join(f"{job.id}\n" for job in jobs))
                ids.flush()
                offered += due
            time.sleep(0.02)


if __name__ == "__main__":
    main(float(sys.argv[1]), sys.argv[2])
