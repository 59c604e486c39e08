"""Where ``ctx.logger``'s records go: ``runworkers`` prints them unless ``LOGGING`` routes them.

Each case runs in a fresh interpreter, whose loggers have no handler, as Django's default
``LOGGING`` leaves these: pytest's log capture gives every logger here handlers of its own.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROLOGUE = """\
import logging, os, sys, uuid
from dataclasses import dataclass
from django_pgoutbox.log import JOB_LOGGERS, SHOWN_LEVEL_VARIABLE, job_logger, show_job_logs

@dataclass
class Attempt:
    id: uuid.UUID = uuid.UUID("01a23bd6-d429-74a0-86b5-46b9e9059ad7")
    job_type: str = "shop.send_receipt"
    queue: str = "default"
    attempt: int = 1
"""
PREFIX = "job 01a23bd6-d429-74a0-86b5-46b9e9059ad7 (shop.send_receipt) attempt 1: "


def printed(script: str) -> str:
    """What ``script`` prints on stdout, in a fresh interpreter."""
    result = subprocess.run(
        [sys.executable, "-c", PROLOGUE + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_handlers_info_line_is_printed_with_its_job() -> None:
    assert printed("""
        assert show_job_logs(sys.stdout, logging.INFO)
        ctx_logger = job_logger(Attempt())
        ctx_logger.info("receipt sent for order %s", 1)
        ctx_logger.debug("not at INFO")
        # The worker's isolated children print at the same level.
        print(os.environ[SHOWN_LEVEL_VARIABLE])
    """) == (f"{PREFIX}receipt sent for order 1\nINFO\n")


def test_a_record_without_job_fields_is_printed_too() -> None:
    assert printed("""
        show_job_logs(sys.stdout, logging.DEBUG)
        logging.getLogger(JOB_LOGGERS + ".by_hand").debug("no extra")
    """) == ("job - (-) attempt -: no extra\n")


def test_a_root_handler_from_the_projects_logging_takes_them_instead() -> None:
    assert printed("""
        logging.basicConfig(stream=sys.stdout, format="root: %(message)s")
        assert not show_job_logs(sys.stdout, logging.INFO)
        job_logger(Attempt()).warning("where the project sends it")
        job_logger(Attempt()).info("below the root's level")
        print(SHOWN_LEVEL_VARIABLE in os.environ)
    """) == ("root: where the project sends it\nFalse\n")


def test_a_level_the_project_set_is_kept() -> None:
    assert printed("""
        logging.getLogger(JOB_LOGGERS).setLevel(logging.ERROR)
        show_job_logs(sys.stdout, logging.INFO)
        job_logger(Attempt()).warning("below the project's level")
        job_logger(Attempt()).error("at it")
        print(os.environ[SHOWN_LEVEL_VARIABLE])
    """) == (f"{PREFIX}at it\nERROR\n")


def test_a_job_types_own_handler_from_the_projects_logging_is_not_doubled() -> None:
    """LOGGING may route one job type's logger (``django_pgoutbox.jobs.<type>``) and leave the
    others: that type's records go to the project's handler alone, not printed a second time."""
    assert printed("""
        import logging.config
        logging.config.dictConfig({
            "version": 1,
            "handlers": {"console": {"class": "logging.StreamHandler", "stream": "ext://sys.stdout",
                                     "formatter": "mine"}},
            "formatters": {"mine": {"format": "mine: %(message)s"}},
            "loggers": {"django_pgoutbox.jobs.shop.send_receipt": {"handlers": ["console"],
                                                                   "level": "INFO"}},
        })
        show_job_logs(sys.stdout, logging.INFO)
        job_logger(Attempt()).info("routed by the project")
        job_logger(Attempt(job_type="shop.other")).info("printed by the worker")
    """) == (
        "mine: routed by the project\n"
        "job 01a23bd6-d429-74a0-86b5-46b9e9059ad7 (shop.other) attempt 1: printed by the worker\n"
    )
