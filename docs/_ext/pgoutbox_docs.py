"""``{django-command}``: a management command's help, from its own argument parser.

    ```{django-command} pgoutbox deadletters retry
    ```

renders what ``manage.py pgoutbox deadletters retry --help`` prints, so the reference cannot
drift from the code.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


class DjangoCommand(SphinxDirective):
    required_arguments = 1
    optional_arguments = 4

    def run(self) -> list[nodes.Node]:
        from django.core.management import get_commands, load_command_class

        name, *path = self.arguments
        commands = get_commands()
        if name not in commands:
            raise self.error(f"no management command {name!r}")
        os.environ["COLUMNS"] = "92"  # argparse wraps to the terminal's width
        parser: argparse.ArgumentParser = load_command_class(commands[name], name).create_parser(
            "manage.py", name
        )
        for word in path:
            parser = _subparser(parser, word, self)
        text = parser.format_help()
        return [nodes.literal_block(text, text, language="text")]


def _subparser(
    parser: argparse.ArgumentParser, word: str, directive: SphinxDirective
) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and word in action.choices:
            found: argparse.ArgumentParser = action.choices[word]
            return found
    raise directive.error(f"{parser.prog!r} has no sub-command {word!r}")


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("django-command", DjangoCommand)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
