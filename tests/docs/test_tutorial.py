"""The tutorial, run as its reader runs it, on a server that asks for a password.

test_docs.py runs the other pages in a project it makes itself, with its own settings and
databases. The tutorial is run as written instead: ``django-admin startproject`` and
``manage.py startapp`` make the project, each file is written or added to where the page says,
in the page's order; the role and the database come from the page's own ``psql`` command;
snippets go to ``manage.py shell``; every ```text block is the output of the block before it and
must appear in what that block printed. The server is one of the test's own, made with
``initdb --auth=scram-sha-256`` (password_server.py): a page that counts on trust authentication
(no PASSWORD, no role of its own) fails here as it would for a reader.

What differs from a reader's machine: the package is on ``PYTHONPATH`` rather than installed
(CI installs the built wheel elsewhere), the server's port comes from ``PGPORT`` (libpq's own
variable, which both ``psql`` and Django read when the settings give no PORT), and ``psql`` gets
the superuser's password that a reader would type at its prompt.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.docs.password_server import PasswordServer, password_server
from tests.docs.test_docs import (
    NOT_RUN,
    RUN_AS_WRITTEN,
    Block,
    Page,
    Project,
    Step,
    load_page,
    settings_text,
)

# A reader runs these: the harness makes nothing for the page.
AS_WRITTEN_NOT_RUN = NOT_RUN - {"django-admin", "createdb"}
# The suite's own server settings, which a reader's shell would not have.
FOREIGN_ENVIRONMENT = (
    *("PGHOST", "PGUSER", "PGPASSWORD", "PGDATABASE", "PGSERVICE", "PGPASSFILE"),
    *("DATABASE_URL", "SECONDARY_DATABASE_URL", "DOCS_DATABASES"),
)

# What the page tells a reader of Django 5.2 or 6.0 to add, whose new project has no MAILERS
# setting (Django 6.1's, which prints e-mails to the console).
CONSOLE_EMAIL = 'EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"'

# What differs from one run to the next in sample output.
VARIABLE = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
    (re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?"), "<time>"),
    (re.compile(r"^Worker \S+:"), "Worker <id>:"),
    (re.compile(r"\b\d+(\.\d+)?s\b"), "<seconds>"),
    (re.compile(r"\s+"), " "),
]


def normalized(line: str) -> str:
    for pattern, replacement in VARIABLE:
        line = pattern.sub(replacement, line.strip())
    return line


def expected_lines(sample: str) -> list[str]:
    """The lines a sample output promises; ``...`` stands for lines it leaves out."""
    return [normalized(line) for line in sample.splitlines() if line.strip() not in {"", "..."}]


def missing_lines(sample: str, output: str) -> list[str]:
    """The sample's lines that the output lacks, in any order: the order of lines from
    concurrent jobs, and of stdout against stderr, is not the page's to promise."""
    printed = {normalized(line) for line in output.splitlines()}
    return [line for line in expected_lines(sample) if line not in printed]


def prints_all(sample: str, output: str) -> bool:
    return not missing_lines(sample, output)


class AsWritten(Project):
    """The page's project as a reader makes it, against ``server``."""

    def __init__(self, page: Page, directory: Path, server: PasswordServer) -> None:
        super().__init__(page, directory)
        self.password_server = server
        self.written: set[str] = set()
        del self.env["DJANGO_SETTINGS_MODULE"]  # the project's manage.py names its own
        for name in FOREIGN_ENVIRONMENT:
            self.env.pop(name, None)
        # psql as a reader has it, with the server's other client tools.
        self.env["PATH"] = f"{server.bin_dir}{os.pathsep}{self.env['PATH']}"
        self.env["PGPORT"] = str(server.port)

    def not_run(self, words: list[str]) -> bool:
        return words[0] in AS_WRITTEN_NOT_RUN or (
            words[0].startswith("python") and words[1:3] in (["-m", "pip"], ["-m", "venv"])
        )

    def _run_command(
        self,
        block: Block,
        command: str,
        words: list[str],
        env: dict[str, str],
        *,
        until: Callable[[str], bool] | None = None,
        stdin: IO[str] | None = None,
    ) -> str:
        if words[0] == "psql":  # what the reader types at its password prompt
            env = {**env, "PGPASSWORD": self.password_server.superuser_password}
        return super()._run_command(block, command, words, env, until=until, stdin=stdin)

    def write_file(self, step: Step) -> None:
        """Replace a file the first time the page shows it, add to it after (settings.py: add
        the page's lines to the one startproject made)."""
        assert step.path is not None
        target = self.directory / step.path
        text = step.text
        append = step.path in self.written
        if step.path.endswith("settings.py"):
            if not target.exists():
                pytest.fail(f"{step.block.where}: {step.path} is edited before the page makes it")
            text, append = settings_text(text), True
            if "MAILERS" not in target.read_text() and CONSOLE_EMAIL not in text:
                if f"`{CONSOLE_EMAIL}`" not in self.page.path.read_text():
                    pytest.fail(
                        f"{step.block.where}: this Django's project sends e-mail over SMTP and "
                        f"the page no longer says to add {CONSOLE_EMAIL}"
                    )
                text += f"\n{CONSOLE_EMAIL}\n"
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a" if append else "w") as handle:
            handle.write(("\n" if append else "") + text)
        self.written.add(step.path)

    def run_in_shell(self, step: Step, number: int) -> str:
        """A snippet, typed into ``manage.py shell`` (which runs what its stdin holds)."""
        script = self.directory / f"_snippet_{number}.py"
        script.write_text(step.text)
        words = [sys.executable, "manage.py", "shell"]
        with script.open() as stdin:
            return self._run_command(
                step.block, "python manage.py shell", words, dict(self.env), stdin=stdin
            )

    def run(self) -> None:
        steps = self.page.steps
        output = ""
        for number, step in enumerate(steps):
            following = steps[number + 1] if number + 1 < len(steps) else None
            # A long-running command runs until it has printed its sample output, if any.
            shows = None
            if following is not None and following.kind == "output":
                shows = functools.partial(prints_all, following.text)
            began = time.monotonic()
            if step.kind == "file":
                self.write_file(step)
            elif step.kind == "shell":
                output = self.run_shell(step, until=shows)
            elif step.kind == "snippet":
                output = self.run_in_shell(step, number)
            elif step.kind == "output":
                missing = missing_lines(step.text, output)
                assert not missing, (
                    f"{step.block.where}: the sample output has lines the run did not print:\n"
                    + "\n".join(missing)
                    + f"\n\nThe run printed:\n{output}"
                )
            else:
                pytest.fail(f"{step.block.where}: a {step.kind} block in a page run as written")
            print(f"  {step.block.where} ({step.kind}): {time.monotonic() - began:.1f} s")
            if step.kind in {"shell", "snippet"}:
                print(textwrap.indent(output, "    | "))


@pytest.fixture(scope="module")
def server() -> Iterator[PasswordServer]:
    with password_server() as started:
        yield started


@pytest.mark.parametrize("path", sorted(RUN_AS_WRITTEN), ids=lambda path: path.name)
def test_page_runs_as_written(path: Path, tmp_path: Path, server: PasswordServer) -> None:
    AsWritten(load_page(path), tmp_path, server).run()


def test_sample_output_in_any_order() -> None:
    sample = "Worker host:1:ab: default (x4)\n...\njob 01a22a1a-2ba7-756d-86fa-200acb7bf0f8 done\n"
    printed = "job 11111111-2ba7-756d-86fa-200acb7bf0f8 done\nWorker other:2:cd: default (x4)\n"
    assert missing_lines(sample, printed) == []
    assert missing_lines(sample, "Worker other:2:cd: default (x2)\n") == [
        "Worker <id>: default (x4)",
        "job <uuid> done",
    ]
