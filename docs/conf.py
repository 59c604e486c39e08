"""Sphinx configuration: MyST Markdown pages, the API reference from the docstrings."""

from __future__ import annotations

import sys
from pathlib import Path

import django
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

# The API reference imports the package, which needs configured settings (never a connection).
settings.configure(
    INSTALLED_APPS=[
        "django.contrib.contenttypes",
        "django.contrib.auth",
        "django.contrib.admin",
        "django_pgoutbox",
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "docs"}},
    DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
)
django.setup()

import django_pgoutbox  # noqa: E402

project = "django-pgoutbox"
author = "django-pgoutbox contributors"
copyright = "2026, django-pgoutbox contributors"
release = django_pgoutbox.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "sphinxcontrib.mermaid",
    "pgoutbox_docs",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
myst_fence_as_directive = ["mermaid"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"

html_theme = "furo"
html_title = f"django-pgoutbox {release}"
