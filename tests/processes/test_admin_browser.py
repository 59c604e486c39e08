"""End to end in a real headless browser: log in, open the dead letters, retry one, see it done.

Needs Debian's chromium and chromium-driver (.ci/run installs them) and selenium (test extra).
Without them the test is skipped, unless PGOUTBOX_REQUIRE_BROWSER=1 (as in CI) makes it fail.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from django_pgoutbox import enqueue
from django_pgoutbox.models import Job, JobStatus
from tests.processes import wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

if not (CHROMIUM and CHROMEDRIVER) and os.environ.get("PGOUTBOX_REQUIRE_BROWSER") != "1":
    pytest.skip("chromium and chromedriver are not installed", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

SCREENSHOTS = Path(os.environ.get("PGOUTBOX_SCREENSHOTS", "/tmp/pgoutbox-screenshots"))


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


def shot(driver: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


@pytest.mark.django_db(transaction=True)  # the browser, the live server and a worker process
def test_retry_a_dead_letter_from_the_admin(
    live_server: Any, browser: Any, start_worker: Any
) -> None:
    User.objects.create_superuser("operator", "op@example.com", "a-long-password")
    job = enqueue("tests.behave", {"order": 42}, queue="webhooks")
    Job.objects.filter(pk=job.pk).update(
        status=JobStatus.DEAD,
        attempts=3,
        last_error_code="TransientError",
        last_error_summary="TransientError: partner unreachable",
        finished_at=timezone.now(),
    )
    start_worker("--roles", "jobs", "--queues", "webhooks", POLL_INTERVAL=0.2)

    browser.get(f"{live_server.url}/admin/login/?next=/admin/pgoutbox/job/overview/")
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys("a-long-password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
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
    confirm.click()
    assert "Retried 1 dead letter." in browser.find_element(By.CSS_SELECTOR, ".messagelist").text

    wait_for(lambda: Job.objects.filter(pk=job.pk, status=JobStatus.COMPLETED).exists(), timeout=20)
    browser.get(f"{live_server.url}/admin/pgoutbox/job/{job.pk}/change/")
    assert "completed" in browser.find_element(By.CSS_SELECTOR, ".field-status").text
    shot(browser, "job-completed")
