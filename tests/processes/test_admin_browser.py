"""End to end in a real headless browser: log in, open the dead letters, retry one, see it done;
pause, resize and resume a queue from the overview while a worker runs it; the charts, in the
light and the dark theme. Each step's screenshot is saved under ``artifacts/screenshots`` (or
``PGOUTBOX_SCREENSHOTS``); docs/admin.md shows some of them (docs/images/).

Needs Debian's chromium and chromium-driver (.ci/run installs them) and selenium (test extra).
Without them the test is skipped, unless PGOUTBOX_REQUIRE_BROWSER=1 (as in CI) makes it fail.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from django_pgoutbox import enqueue
from django_pgoutbox.maintenance import fill_dead_causes
from django_pgoutbox.models import Job, JobStatus
from tests.processes import holds_for, wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

if not (CHROMIUM and CHROMEDRIVER) and os.environ.get("PGOUTBOX_REQUIRE_BROWSER") != "1":
    pytest.skip("chromium and chromedriver are not installed", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(os.environ.get("PGOUTBOX_SCREENSHOTS", ROOT / "artifacts" / "screenshots"))


@pytest.fixture
def browser() -> Any:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(5)
    yield driver
    driver.quit()


def shot(driver: Any, name: str, element: Any = None) -> Path:
    """Save the page (or one ``element`` of it) as ``name``.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    if element is not None:
        element.screenshot(str(path))
    else:
        driver.save_screenshot(str(path))
    return path


def click_through(browser: Any, element: Any) -> None:
    """Click ``element`` and wait for the page it loads, whole: until then, what the next look
    finds may be the old page's (its message list, say) and vanish under it, or an element of
    the new page still being parsed, which a POST's redirect then replaces ("Node with given id
    does not belong to the document")."""
    page = browser.find_element(By.TAG_NAME, "html")
    element.click()
    wait = WebDriverWait(browser, 10)
    wait.until(expected_conditions.staleness_of(page))
    wait.until(lambda b: b.execute_script("return document.readyState") == "complete")


def log_in(browser: Any, live_server: Any, next_url: str) -> None:
    User.objects.create_superuser("operator", "op@example.com", "a-long-password")
    browser.get(f"{live_server.url}/admin/login/?next={next_url}")
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys("a-long-password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()


@pytest.mark.django_db(transaction=True)  # the browser, the live server and a worker process
def test_retry_a_dead_letter_from_the_admin(
    live_server: Any, browser: Any, start_worker: Any
) -> None:
    job = enqueue("tests.behave", {"order": 42}, queue="webhooks")
    Job.objects.filter(pk=job.pk).update(
        status=JobStatus.DEAD,
        attempts=3,
        last_error_code="TransientError",
        last_error_summary="TransientError: partner unreachable",
        finished_at=timezone.now(),
    )
    start_worker("--roles", "jobs", "--queues", "webhooks", POLL_INTERVAL=0.2)

    log_in(browser, live_server, "/admin/pgoutbox/job/overview/")
    queues = browser.find_element(By.ID, "queues").text
    assert "webhooks" in queues
    shot(browser, "overview")
    browser.find_element(
        By.CSS_SELECTOR, 'a[href="/admin/pgoutbox/deadletter/?queue=webhooks"]'
    ).click()

    # find_element waits (implicitly) for the next page; page_source would not.
    assert "partner unreachable" in browser.find_element(By.ID, "result_list").text
    shot(browser, "dead-letters")
    browser.find_element(By.CSS_SELECTOR, f'input.action-select[value="{job.pk}"]').click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("retry_now")
    browser.find_element(By.CSS_SELECTOR, 'button[name="index"]').click()
    confirm = browser.find_element(By.ID, "confirm-action")
    assert "Retry dead letters" in browser.title
    shot(browser, "confirm-retry")
    click_through(browser, confirm)
    assert "Retried 1 dead letter." in browser.find_element(By.CSS_SELECTOR, ".messagelist").text

    wait_for(lambda: Job.objects.filter(pk=job.pk, status=JobStatus.COMPLETED).exists(), timeout=20)
    browser.get(f"{live_server.url}/admin/pgoutbox/job/{job.pk}/change/")
    assert "completed" in browser.find_element(By.CSS_SELECTOR, ".field-status").text
    shot(browser, "job-completed")


def _minutes_of_a_busy_queue() -> None:
    """Three hours of a queue's minutes, as workers and maintenance would have written them: a
    steady drain, a burst of failures, a backlog that builds and clears."""
    rows = []
    for minute in range(180):
        completed = 600 + int(250 * math.sin(minute / 12))
        failed = 40 if 95 <= minute <= 110 else 3
        backlog = max(0, 2000 - abs(minute - 120) * 40) if minute >= 70 else 15
        rows.append((minute, completed, failed, 1 if failed > 3 else 0, backlog, backlog / 30))
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO queue_minutes "
            "(queue, minute, completed, failed, dead, backlog, oldest_pending_age) "
            "VALUES ('default', date_trunc('minute', now()) - make_interval(mins => 179 - %s), "
            "%s, %s, %s, %s, %s)",
            rows,
        )


@pytest.mark.django_db(transaction=True)
def test_pause_resize_and_resume_a_queue_and_read_its_charts(
    live_server: Any, browser: Any, start_worker: Any
) -> None:
    _minutes_of_a_busy_queue()
    # Its poll interval is long: the pause and the resume reach it by notification.
    start_worker("--roles", "jobs", "--queues", "reports", POLL_INTERVAL=60)
    log_in(browser, live_server, "/admin/pgoutbox/job/overview/")
    click_through(browser, browser.find_element(By.ID, "pause-reports"))
    assert "Queue reports is paused" in browser.find_element(By.CSS_SELECTOR, ".messagelist").text
    assert "paused" in browser.find_element(By.CSS_SELECTOR, "#queue-reports .queue-state").text
    shot(browser, "overview-paused", browser.find_element(By.ID, "queues"))

    job = enqueue("tests.behave", {"record": False}, queue="reports")
    holds_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.PENDING, 2)

    concurrency = browser.find_element(By.CSS_SELECTOR, "#queue-reports input[name=concurrency]")
    concurrency.clear()
    concurrency.send_keys("3")
    click_through(browser, browser.find_element(By.ID, "resize-button-reports"))
    assert "concurrency 3 per worker" in browser.find_element(By.CSS_SELECTOR, ".messagelist").text
    assert "set at run time" in browser.find_element(By.CSS_SELECTOR, "#queue-reports").text
    shot(browser, "overview-resized", browser.find_element(By.ID, "queues"))

    click_through(browser, browser.find_element(By.ID, "resume-reports"))
    assert "Queue reports is resumed" in browser.find_element(By.CSS_SELECTOR, ".messagelist").text
    wait_for(lambda: Job.objects.filter(pk=job.pk, status=JobStatus.COMPLETED).exists(), timeout=10)
    click_through(browser, browser.find_element(By.ID, "reset-reports"))
    assert (
        "runs with its settings again" in browser.find_element(By.CSS_SELECTOR, ".messagelist").text
    )

    browser.get(f"{live_server.url}/admin/pgoutbox/job/overview/?hours=3#activity")
    charts = browser.find_element(By.ID, "charts")
    paths = browser.find_elements(By.CSS_SELECTOR, "#charts-default svg path")
    assert len(paths) == 4  # completed, failed, backlog, oldest due: each drawn
    assert re.search(r"completed: max 8[45]\d, last \d+", charts.get_attribute("innerHTML"))
    shot(browser, "charts", charts)
    browser.execute_script("localStorage.setItem('theme', 'dark')")
    browser.refresh()
    shot(browser, "charts-dark", browser.find_element(By.ID, "charts"))


@pytest.mark.django_db(transaction=True)
def test_retry_every_dead_letter_of_one_cause(
    live_server: Any, browser: Any, start_worker: Any
) -> None:
    """Dead letters of two causes (a partner's timeouts with an order number each, a bad
    coupon); the timeouts' cause retried as a whole, the coupons left dead."""
    dead = []
    for order in range(1, 8):
        summary = f"TransientError: partner timed out after 30s for order {1000 + order}"
        dead.append(("TransientError", summary))
    for coupon in ("SPRING", "WINTER"):
        dead.append(("PermanentError", f"PermanentError: coupon '{coupon}' does not exist"))
    for code, summary in dead:
        job = enqueue("tests.behave", {"record": False}, queue="webhooks")
        Job.objects.filter(pk=job.pk).update(
            status=JobStatus.DEAD,
            attempts=3,
            last_error_code=code,
            last_error_summary=summary,
            finished_at=timezone.now(),
        )
    # Killed by an UPDATE of the test's own: their causes come from the maintenance, as the
    # lease recovery's job gives them.
    assert fill_dead_causes() == len(dead)
    start_worker("--roles", "jobs", "--queues", "webhooks", POLL_INTERVAL=0.2)
    log_in(browser, live_server, "/admin/pgoutbox/deadletter/causes/")
    causes = browser.find_element(By.ID, "causes")
    rows = causes.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == 2
    first = rows[0].text
    assert first.startswith("7 ")  # the biggest first
    assert "partner timed out after <n>s for order <n>" in first
    assert "coupon '…' does not exist" in rows[1].text
    shot(browser, "dead-letter-causes")
    click_through(browser, rows[0].find_element(By.LINK_TEXT, "Retry all"))
    confirm = browser.find_element(By.ID, "confirm-action")
    assert "7" in browser.find_element(By.ID, "content").text
    shot(browser, "confirm-retry-cause")
    click_through(browser, confirm)
    assert "Retried 7 dead letters." in browser.find_element(By.CSS_SELECTOR, ".messagelist").text
    wait_for(lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == 7, timeout=20)
    assert Job.objects.filter(status=JobStatus.DEAD).count() == 2
