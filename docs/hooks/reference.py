"""MkDocs hook: the reference pages that are generated from the code, so they cannot drift.

A page that holds one of these markers gets it replaced at build time:

- ``<!-- ragpic:cli -->``: every ``ragpic`` command's ``--help``, walked from the argparse parser
  (``ragpic.cli.main.build_parser`` and the parsers of ``eval needle`` / ``eval ruler``);
- ``<!-- ragpic:config -->``: a table of every ``ragpic.Config`` field (its type, its default and
  the meaning its docstring gives); a field the docstring does not describe fails the build.

Imports only what ``ragpic --help`` imports (no torch).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re

CLI_MARK = "<!-- ragpic:cli -->"
CONFIG_MARK = "<!-- ragpic:config -->"
HELP_WIDTH = "100"


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - the MkDocs hook signature
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_reference())
    if CONFIG_MARK in markdown:
        markdown = markdown.replace(CONFIG_MARK, config_reference())
    return markdown


# -- the command line ------------------------------------------------------------------------

def commands() -> list[tuple[str, argparse.ArgumentParser]]:
    """``(command line, parser)`` for ``ragpic`` and every command under it, in the parser's order."""
    from ragpic.cli.main import build_parser
    from ragpic.cli.eval import build_needle_parser
    from ragpic.cli.ruler import build_ruler_parser

    out: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        out.append((name, parser))
        for action in parser._actions:  # argparse keeps subcommands only here
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(f"{name} {sub_name}", sub)
                    if f"{name} {sub_name}" == "ragpic eval":
                        walk("ragpic eval needle", build_needle_parser())
                        walk("ragpic eval ruler", build_ruler_parser())

    walk("ragpic", build_parser())
    return out


def help_text(parser: argparse.ArgumentParser, name: str) -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH  # argparse wraps at the terminal's width: fix it
    try:
        parser.prog = name
        return parser.format_help().rstrip()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def cli_reference() -> str:
    parts = []
    for name, parser in commands():
        level = "##" if name.count(" ") <= 1 else "###"
        parts.append(f"{level} `{name}`\n\n```text\n{help_text(parser, name)}\n```\n")
    return "\n".join(parts)


# -- Config ----------------------------------------------------------------------------------

def config_docs() -> dict[str, str]:
    """Each field's text from ``Config``'s docstring (``Attributes:``; ``a, b: text`` covers both)."""
    from ragpic.config import Config

    doc = Config.__doc__ or ""
    body = doc.split("Attributes:", 1)[1]
    entries: dict[str, str] = {}
    current: list[str] = []
    text: list[str] = []
    for line in body.splitlines():
        m = re.match(r"^ {8}([a-z_][a-z_0-9, ]*):\s*(.*)$", line)
        if m:
            for name in current:
                entries[name] = " ".join(text)
            current = [n.strip() for n in m.group(1).split(",")]
            text = [m.group(2)]
        elif line.strip():
            text.append(line.strip())
    for name in current:
        entries[name] = " ".join(text)
    return entries


def notebook_anchors() -> dict[str, str]:
    """``"17b"`` -> that section's anchor in the lab notebook (docs/archive/notebook.md)."""
    from markdown.extensions.toc import slugify

    path = os.path.join(os.path.dirname(__file__), "..", "archive", "notebook.md")
    with open(path, encoding="utf-8") as f:
        heads = re.findall(r"^#{2,3} (\d+[a-z]?)\. (.+)$", f.read(), re.M)
    return {n: slugify(f"{n}. {title}".replace("`", ""), "-") for n, title in heads}


def cite_links(text: str) -> str:
    """``docs/RESULTS.md §17`` (a citation of the lab notebook) as a link to that section."""
    anchors = notebook_anchors()

    def link(m: re.Match) -> str:
        n = m.group(1)
        return f"[notebook §{n}](../archive/notebook.md#{anchors[n]})" if n in anchors else m.group(0)

    text = re.sub(r"docs/RESULTS\.md §(\d+[a-z]?)", link, text)
    return re.sub(r"docs/ARCHITECTURE\.md (§[\d.]+)", r"[ARCHITECTURE \1](../ARCHITECTURE.md)", text)


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return f"`{field.default!r}`"
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f"`{field.default_factory()!r}`"  # type: ignore[misc]
    return "required"


def config_reference() -> str:
    from ragpic.config import Config

    docs = config_docs()
    missing = [f.name for f in dataclasses.fields(Config) if f.name not in docs]
    if missing:
        raise RuntimeError(f"ragpic.Config's docstring does not describe: {', '.join(missing)}")
    rows = ["| field | type | default | what it sets |", "|---|---|---|---|"]
    for f in dataclasses.fields(Config):
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        text = docs[f.name].replace("|", "\\|")
        text = re.sub(r":(?:class|func|data|mod|attr):`~?([^`]+)`", r"`\1`", text)  # Sphinx roles, as code
        text = cite_links(text)
        rows.append(f"| `{f.name}` | `{kind}` | {_default(f)} | {text} |")
    return "\n".join(rows) + "\n"
