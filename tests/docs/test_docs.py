"""Every code example of the documentation runs, so that none goes stale.

The rules a page's examples follow are in docs/contributing.md. In short: each page gets a
throwaway Django project in a temporary directory and fresh databases of its own; Python blocks are
split into the project's files by ``# path.py`` header comments, and the rest of each block is a
snippet run in a fresh process with Django set up; shell commands run from the project's
directory; SQL runs against the migrated database (rolled back); configuration blocks are parsed,
and the ``manage.py`` command lines in them are checked by the command's own argument parser.
Everything runs in document order.
"""

from __future__ import annotations

import configparser
import contextlib
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest
import yaml
from django.core.management import get_commands, load_command_class
from psycopg import sql

from django_pgoutbox import db

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(
    [path for path in DOCS.rglob("*.md") if "_build" not in path.parts] + [ROOT / "README.md"]
)
# Pages that tests/docs/test_tutorial.py runs as their reader would, in a project they make.
RUN_AS_WRITTEN = {DOCS / "tutorial.md"}

NOT_CODE = {"text", "mermaid", ""}
PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell", "console"}
CONFIG = {"json", "yaml", "toml", "ini"}
# Commands for a machine the tests do not have; docs/contributing.md says what covers each.
NOT_RUN = {"pip", "pip3", "./run", "systemctl", "journalctl", "kubectl", "docker", "curl", "sudo"}
# The harness makes the project, its apps, its databases and its environment itself.
NOT_RUN |= {"django-admin", "source", ".", "createdb"}
# manage.py commands the harness does not run: it makes the apps; the shells are interactive.
NOT_RUN_MANAGE = {"startapp", "shell", "dbshell", "createsuperuser"}
# runworkers without --burst runs until stopped: it gets this long, then SIGTERM.
LONG_RUNNING_SECONDS = 3.0
# ... counted from its start line, which it gets this long to print.
STARTUP_TIMEOUT = 60.0
STARTED = ("Worker ", "Quit the server with")
COMMAND_TIMEOUT = 120

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
MARKER = re.compile(
    r"<!--\s*docs-test:\s*(?P<what>skip|exit=\d+)\s*(?:\((?P<reason>[^)]*)\))?\s*-->"
)
FILE_HEADER = re.compile(r"^# (?P<path>[\w./-]+\.py)(?:(?::|\s{2,}).*)?$")


@dataclass
class Block:
    page: Path
    line: int
    language: str
    text: str
    skip: str | None = None
    expect_exit: int = 0

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """The fenced code blocks of a page, with the marker on the line before each, if any."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        indent, fence, info = match["indent"], match["fence"], match["info"].strip()
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not (
            lines[end].strip().startswith(fence) and lines[end].strip().strip(fence[0]) == ""
        ):
            line = lines[end]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            end += 1
        language = info.split()[0] if info else ""
        block = Block(page, index + 1, language, "\n".join(body) + "\n")
        previous = lines[index - 1] if index else ""
        marker = MARKER.search(previous)
        if marker:
            if marker["what"] == "skip":
                block.skip = (marker["reason"] or "").strip()
            else:
                block.expect_exit = int(marker["what"].split("=")[1])
        if not language.startswith("{"):  # MyST directives (toctree, include) are not examples
            found.append(block)
        index = end + 1
    return found


def test_every_block_is_a_known_kind() -> None:
    """A block in a language the harness does not know would silently never run."""
    known = NOT_CODE | PYTHON | SHELL | CONFIG | {"sql"}
    unknown = [
        f"{block.where} ```{block.language}"
        for page in PAGES
        for block in blocks_of(page)
        if block.language not in known
    ]
    assert not unknown, "blocks no test runs (mark sample output as ```text): " + ", ".join(unknown)


def test_skipped_blocks_say_why() -> None:
    skipped = [block for page in PAGES for block in blocks_of(page) if block.skip is not None]
    for block in skipped:
        print(f"skipped: {block.where}: {block.skip}")
    assert all(block.skip for block in skipped), "a docs-test: skip marker needs a (reason)"


# -- the page's project --------------------------------------------------------------------------

BASE_SETTINGS = """\
import os, json
SECRET_KEY = "docs-example"
DEBUG = True
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_pgoutbox",
    "myapp",
]
try:
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
STATIC_URL = "static/"
# E-mail goes to the console, as in a project that `startproject` makes with Django 6.1.
import django
if django.VERSION >= (6, 1):
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.console.EmailBackend"}}
else:
    EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
"""

# Appended after the page's settings: every alias it names gets a throwaway database.
SETTINGS_EPILOGUE = """
INSTALLED_APPS = list(dict.fromkeys(INSTALLED_APPS))
_docs_databases = json.loads(os.environ["DOCS_DATABASES"])
for _alias, _entry in DATABASES.items():
    _mirror = (_entry.get("TEST") or {}).get("MIRROR")
    _entry.update(_docs_databases.get(_mirror or _alias) or _docs_databases["*"])
    _entry.setdefault("ENGINE", "django.db.backends.postgresql")
"""

BASE_URLS = """\
from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls)]
"""

MANAGE = """\
import os, sys
from django.core.management import execute_from_command_line
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
execute_from_command_line(sys.argv)
"""

SNIPPET_PROLOGUE = """\
import os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
import django
django.setup()
"""

MIGRATE = re.compile(r"manage\.py migrate\b")
ELLIPSIS_LIST = re.compile(r"^(?P<name>[A-Z_][A-Z0-9_]*)\s*=\s*\[\s*\.\.\.\s*,", re.MULTILINE)
ELLIPSIS_DICT = re.compile(r"^(?P<name>[A-Z_][A-Z0-9_]*)\s*=\s*\{\s*\.\.\.\s*,", re.MULTILINE)


def settings_text(text: str) -> str:
    """A page's settings section, where `NAME = [..., x]` extends the value NAME already has."""
    text = ELLIPSIS_LIST.sub(lambda m: f"{m['name']} = [*{m['name']},", text)
    return ELLIPSIS_DICT.sub(lambda m: f"{m['name']} = {{**{m['name']},", text)


@dataclass
class Step:
    """One thing to run, in document order."""

    kind: str  # snippet | shell | sql | config | file | output
    block: Block
    text: str
    #: The project's file that a ``file`` step writes.
    path: str | None = None


@dataclass
class Page:
    path: Path
    files: dict[str, str] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    skipped: list[Block] = field(default_factory=list)

    @property
    def needs_project(self) -> bool:
        return any(step.kind in {"snippet", "shell", "sql", "file"} for step in self.steps)


def split_python(block: Block) -> Iterator[tuple[str | None, str]]:
    """(path, text) sections of a Python block; path None for a snippet."""
    path: str | None = None
    current: list[str] = []
    for line in block.text.splitlines():
        header = FILE_HEADER.match(line)
        if header:
            if "".join(current).strip():
                yield path, "\n".join(current) + "\n"
            path, current = header["path"], []
            continue
        current.append(line)
    if "".join(current).strip():
        yield path, "\n".join(current) + "\n"


def load_page(path: Path) -> Page:
    page = Page(path)
    for block in blocks_of(path):
        if block.skip is not None:
            if block.language not in NOT_CODE:
                page.skipped.append(block)
            continue
        if block.language == "text":
            # Sample output of the block before it: a page run as written checks it
            # (tests/docs/test_tutorial.py); the other pages only show it.
            page.steps.append(Step("output", block, block.text))
            continue
        if block.language in NOT_CODE:
            continue
        if block.language in PYTHON:
            for file_path, text in split_python(block):
                if file_path is None:
                    page.steps.append(Step("snippet", block, text))
                    continue
                page.steps.append(Step("file", block, text, file_path))
                if file_path.endswith("settings.py"):
                    page.files["settings.py"] = page.files.get("settings.py", "") + settings_text(
                        text
                    )
                elif file_path.endswith("urls.py") and file_path.count("/") <= 1:
                    page.files["urls.py"] = page.files.get("urls.py", "") + text
                else:
                    page.files[file_path] = page.files.get(file_path, "") + text
        elif block.language in SHELL:
            page.steps.append(Step("shell", block, block.text))
        elif block.language == "sql":
            page.steps.append(Step("sql", block, block.text))
        else:
            page.steps.append(Step("config", block, block.text))
    return page


DROP_DATABASE = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")


class Project:
    """A page's throwaway Django project and its databases."""

    def __init__(self, page: Page, directory: Path) -> None:
        self.page = page
        self.directory = directory
        slug = re.sub(r"[^a-z0-9]+", "_", str(page.path.relative_to(ROOT)).lower()).strip("_")
        # The process id keeps two test runs on one server (two checkouts) apart.
        self.prefix = f"docs{os.getpid()}_{slug}"[:50]
        self.server = db.raw_connection_params("default")
        self.databases: list[str] = []
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "settings",
            # The page's project first; then what the suite runs with (a checkout's own
            # package, where PYTHONPATH points at it rather than at the installed one).
            "PYTHONPATH": os.pathsep.join(
                [str(directory), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
            ).rstrip(os.pathsep),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PGOUTBOX_DEBUG": "1",
            "PYTHONUNBUFFERED": "1",  # start lines arrive as they would on a terminal
        }

    def write(self) -> None:
        files = dict(self.page.files)
        settings = BASE_SETTINGS + files.pop("settings.py", "") + SETTINGS_EPILOGUE
        urls = BASE_URLS + files.pop("urls.py", "")
        (self.directory / "settings.py").write_text(settings)
        (self.directory / "urls.py").write_text(urls)
        (self.directory / "manage.py").write_text(MANAGE)
        (self.directory / "myapp").mkdir()
        (self.directory / "myapp" / "__init__.py").write_text("")
        for relative, text in files.items():
            target = self.directory / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            for parent in target.relative_to(self.directory).parents:
                init = self.directory / parent / "__init__.py"
                if str(parent) != "." and not init.exists():
                    init.write_text("")
            with target.open("a") as handle:
                handle.write(text)

    def aliases(self) -> list[str]:
        probe = (
            "import json, runpy; "
            "databases = runpy.run_path('settings.py')['DATABASES']; "
            "print(json.dumps([a for a, e in databases.items() "
            "if not (e.get('TEST') or {}).get('MIRROR')]))"
        )
        # The epilogue needs an entry for every alias: "*" gives the probe one for any.
        env = {**self.env, "DOCS_DATABASES": json.dumps({"*": self._entry("default")})}
        result = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=self.directory,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if result.returncode:
            pytest.fail(f"{self.page.path.name}: settings.py does not load:\n{result.stderr}")
        aliases: list[str] = json.loads(result.stdout.strip().splitlines()[-1])
        return aliases

    def _entry(self, alias: str) -> dict[str, Any]:
        name = self.prefix if alias == "default" else f"{self.prefix}_{alias}"[:63]
        return {
            "NAME": name,
            "USER": self.server.get("user") or "postgres",
            "PASSWORD": self.server.get("password") or "",
            "HOST": self.server.get("host") or "",
            "PORT": str(self.server.get("port") or ""),
        }

    def _entries(self, aliases: list[str]) -> dict[str, dict[str, Any]]:
        return {alias: self._entry(alias) for alias in aliases}

    def create_databases(self) -> None:
        aliases = self.aliases()
        self.env["DOCS_DATABASES"] = json.dumps(self._entries(aliases))
        with psycopg.connect(**{**self.server, "dbname": "postgres"}, autocommit=True) as conn:
            for alias in aliases:
                name = self._entry(alias)["NAME"]
                conn.execute(DROP_DATABASE.format(sql.Identifier(name)))
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                self.databases.append(name)
        if any(step.kind == "shell" and MIGRATE.search(step.text) for step in self.page.steps):
            return  # the page migrates, as its reader would
        for alias in aliases:
            self.manage(["migrate", "--run-syncdb", "--database", alias, "--verbosity", "0"])

    def drop_databases(self) -> None:
        with psycopg.connect(**{**self.server, "dbname": "postgres"}, autocommit=True) as conn:
            for name in self.databases:
                conn.execute(DROP_DATABASE.format(sql.Identifier(name)))

    def manage(self, args: list[str]) -> None:
        result = self._python(["manage.py", *args])
        if result.returncode:
            pytest.fail(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")

    def _python(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args],
            cwd=self.directory,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
        )

    # -- steps ------------------------------------------------------------------------------------

    def run_snippet(self, step: Step, number: int) -> None:
        script = self.directory / f"_snippet_{number}.py"
        script.write_text(SNIPPET_PROLOGUE + step.text)
        result = self._python([script.name])
        if result.returncode:
            pytest.fail(
                f"{step.block.where}: the Python example failed:\n"
                f"{textwrap.indent(step.text, '    ')}\n{result.stdout}\n{result.stderr}"
            )

    def not_run(self, words: list[str]) -> bool:
        """Whether a command is one the harness does not run (docs/contributing.md says why)."""
        return words[0] in NOT_RUN or (
            words[0].startswith("python")
            and (
                words[1:3] in (["-m", "pip"], ["-m", "venv"])
                or (len(words) > 2 and words[2] in NOT_RUN_MANAGE and "--noinput" not in words)
            )
        )

    def run_shell(self, step: Step, until: Callable[[str], bool] | None = None) -> str:
        """Run a shell block's commands; their output. A long-running command runs on until
        ``until`` holds for its output (or its deadline)."""
        output = ""
        for command in shell_commands(step.block):
            words = shlex.split(command, comments=True)
            if not words:
                continue
            if words[0] == "export":
                for assignment in words[1:]:
                    key, _, value = assignment.partition("=")
                    self.env[key] = value
                continue
            env = dict(self.env)
            while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                key, _, value = words.pop(0).partition("=")
                env[key] = value
            if self.not_run(words):
                continue
            if words[0] in {"python", "python3"}:
                words[0] = sys.executable
            output += self._run_command(step.block, command, words, env, until=until)
        return output

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
        """Run one command; its output (stdout, then stderr)."""
        long_running = ("runworkers" in words and "--burst" not in words) or "runserver" in words
        process = subprocess.Popen(
            words,
            cwd=self.directory,
            env=env,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        out: list[str] = []
        err: list[str] = []
        readers = [
            threading.Thread(target=_read_into, args=(process.stdout, out), daemon=True),
            threading.Thread(target=_read_into, args=(process.stderr, err), daemon=True),
        ]
        for reader in readers:
            reader.start()
        try:
            if long_running:
                # Signal it once it runs (its start line, or the server's), not while Django is
                # still starting: a loaded machine can take seconds to get there.
                quiet = bool({"-v", "--verbosity", "-v0"} & set(words))
                deadline = time.monotonic() + (0 if quiet else STARTUP_TIMEOUT)
                while time.monotonic() < deadline and process.poll() is None:
                    if any(line.startswith(STARTED) for line in out + err):
                        break
                    time.sleep(0.1)
                # At least LONG_RUNNING_SECONDS; longer while what it should print is missing.
                enough = time.monotonic() + LONG_RUNNING_SECONDS
                deadline = time.monotonic() + STARTUP_TIMEOUT
                while process.poll() is None and (
                    time.monotonic() < enough
                    or (until and not until("".join(out + err)) and time.monotonic() < deadline)
                ):
                    time.sleep(0.1)
                if process.poll() is not None:
                    for reader in readers:
                        reader.join(timeout=5)
                    pytest.fail(
                        f"{block.where}: `{command}` stopped by itself "
                        f"(status {process.returncode}):\n{''.join(out)}\n{''.join(err)}"
                    )
                process.send_signal(signal.SIGTERM)
            process.wait(timeout=COMMAND_TIMEOUT)
        finally:
            # Whatever it left behind (runserver's reloaded child, a fork server) goes too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            for reader in readers:
                reader.join(timeout=5)
        status_counts = not (long_running and "runserver" in words)  # it dies by the signal
        if status_counts and process.returncode != block.expect_exit:
            pytest.fail(
                f"{block.where}: `{command}` exited with status {process.returncode} "
                f"(expected {block.expect_exit}):\n{''.join(out)}\n{''.join(err)}"
            )
        return "".join(out) + "".join(err)

    def run_sql(self, step: Step) -> None:
        text = step.text
        if re.search(r"\bALTER\s+SYSTEM\b|pg_reload_conf", text, re.IGNORECASE):
            pytest.fail(f"{step.block.where}: an example must not reconfigure the server")
        autocommit = bool(re.match(r"\s*(VACUUM|CREATE INDEX CONCURRENTLY)", text, re.IGNORECASE))
        params = {**self.server, "dbname": self.prefix}
        with psycopg.connect(**params, autocommit=autocommit) as conn:
            if re.search(r"\bCREATE\s+TABLE\b", text, re.IGNORECASE):
                # DDL of the tables themselves: run it where they do not exist yet.
                # (a schema of its own: the block may COMMIT)
                schema = f"docs_ddl_{step.block.line}"
                conn.execute(f"CREATE SCHEMA {schema}; SET LOCAL search_path TO {schema}")
            try:
                conn.execute(text.encode())  # several statements: the simple query protocol
            except psycopg.Error as exc:
                pytest.fail(f"{step.block.where}: the SQL example failed: {exc}\n{text}")
            if not autocommit:
                conn.rollback()


def _read_into(stream: Any, lines: list[str]) -> None:
    for line in stream:
        lines.append(line)


def shell_commands(block: Block) -> list[str]:
    """The commands of a shell block, continuation lines joined; in console, the `$ ` lines."""
    lines = block.text.splitlines()
    if block.language == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    commands: list[str] = []
    pending = ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        commands.append(pending + line)
        pending = ""
    return [command for command in commands if command.strip()]


# -- configuration blocks ------------------------------------------------------------------------


def check_manage_py(block: Block, words: list[str]) -> None:
    """The arguments after `manage.py` parse with that command's own parser."""
    index = next(i for i, word in enumerate(words) if word.endswith("manage.py"))
    args = words[index + 1 :]
    assert args, f"{block.where}: manage.py without a command"
    commands = get_commands()
    name = args[0]
    assert name in commands, f"{block.where}: no management command {name!r}"
    command = load_command_class(commands[name], name)
    parser = command.create_parser("manage.py", name)
    try:
        parser.parse_args(args[1:])
    except SystemExit as exc:  # argparse reports the error on stderr, then exits
        pytest.fail(f"{block.where}: `manage.py {' '.join(args)}` does not parse ({exc})")


def manage_py_lines_in_yaml(node: Any) -> Iterator[list[str]]:
    if isinstance(node, dict):
        command = node.get("command")
        if isinstance(command, list):
            words = [str(word) for word in [*command, *(node.get("args") or [])]]
            if len(words) >= 3 and words[:2] in (["sh", "-c"], ["/bin/sh", "-c"]):
                words = shlex.split(words[2])
            if any(word.endswith("manage.py") for word in words):
                yield words
        for value in node.values():
            yield from manage_py_lines_in_yaml(value)
    elif isinstance(node, list):
        for value in node:
            yield from manage_py_lines_in_yaml(value)


def check_config(block: Block) -> int:
    """Parse a configuration block; the number of manage.py command lines checked."""
    checked = 0
    if block.language == "json":
        json.loads(block.text)
    elif block.language == "toml":
        tomllib.loads(block.text)
    elif block.language == "yaml":
        for document in yaml.safe_load_all(block.text):
            for words in manage_py_lines_in_yaml(document):
                check_manage_py(block, words)
                checked += 1
    elif block.language == "ini":
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read_string(block.text)
        for section in parser.sections():
            for key in ("ExecStart", "ExecStartPre", "ExecReload"):
                value = parser[section].get(key)
                if value and "manage.py" in value:
                    check_manage_py(block, shlex.split(value.lstrip("-@+!")))
                    checked += 1
    return checked


# -- the tests -----------------------------------------------------------------------------------


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize(
    "path", [page for page in PAGES if page not in RUN_AS_WRITTEN], ids=_page_id
)
def test_page_examples_run(path: Path, tmp_path: Path) -> None:
    if "from django.tasks import" in path.read_text() and not importlib.util.find_spec(
        "django.tasks"
    ):
        pytest.skip("the page's examples use django.tasks, which Django 6 has and 5.2 has not")
    page = load_page(path)
    for block in page.skipped:
        print(f"skipped {block.where}: {block.skip}")
    if not page.needs_project:
        for step in page.steps:
            if step.kind == "config":
                check_config(step.block)
        return
    project = Project(page, tmp_path)
    project.write()
    started = time.monotonic()
    project.create_databases()
    try:
        for number, step in enumerate(page.steps):
            if step.kind in {"file", "output"}:  # files are written; output is not compared
                continue
            began = time.monotonic()
            if step.kind == "snippet":
                project.run_snippet(step, number)
            elif step.kind == "shell":
                project.run_shell(step)
            elif step.kind == "sql":
                project.run_sql(step)
            elif step.kind == "config":
                check_config(step.block)
            print(f"  {step.block.where} ({step.kind}): {time.monotonic() - began:.1f} s")
    finally:
        project.drop_databases()
    print(f"{path.name}: {len(page.steps)} steps in {time.monotonic() - started:.1f} s")
