"""Admin changelists on one million finished jobs: how long each page takes to render.

    python benchmarks/admin.py [--rows 1000000]

Fills a fresh ``pgoutbox_bench`` database with finished jobs (and a thousand dead letters),
then renders each page five times through Django's test client and prints the median.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import ROOT, setup_django, write_results

PAGES = [
    "/admin/pgoutbox/job/",
    "/admin/pgoutbox/job/?status=completed",
    "/admin/pgoutbox/job/?queue=webhooks",
    "/admin/pgoutbox/job/?status=pending",
    "/admin/pgoutbox/deadletter/",
    "/admin/pgoutbox/deadletter/?queue=webhooks",
    "/admin/pgoutbox/job/overview/",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    setup_django()
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs (queue, job_type, payload, status, attempts, finished_at, "
            "completed_at) SELECT (ARRAY['default', 'webhooks', 'reports', 'notifications'])"
            "[1 + n %% 4], 'bench.job', jsonb_build_object('n', n), 'completed', 1, now(), now() "
            "FROM generate_series(1, %s) AS n",
            [args.rows],
        )
        cursor.execute(
            "INSERT INTO jobs (queue, job_type, payload, status, attempts, finished_at, "
            "last_error_code, last_error_summary) SELECT 'webhooks', 'bench.job', '{}', 'dead', 3, "
            "now(), 'TransientError', 'TransientError: timeout' FROM generate_series(1, 1000)"
        )
        cursor.execute("VACUUM ANALYZE jobs")
    print(f"filled {args.rows:,} finished jobs in {time.perf_counter() - started:.0f}s")
    client = Client()
    client.force_login(User.objects.create_superuser("bench", "b@example.com", "pw"))
    results = {}
    print(f"{'page':<52}{'median ms':>10}")
    for page in PAGES:
        timings = []
        for _ in range(5):
            begin = time.perf_counter()
            response = client.get(page)
            timings.append((time.perf_counter() - begin) * 1000)
            assert response.status_code == 200, (page, response.status_code)
        results[page] = statistics.median(timings)
        print(f"{page:<52}{results[page]:>10.0f}")
    path = write_results("admin", {"rows": args.rows, "median_ms": results})
    print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
