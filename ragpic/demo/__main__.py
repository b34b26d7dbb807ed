"""``python -m ragpic.demo`` runs ``ragpic demo`` (the CLI parses and checks the arguments)."""

import sys

from ragpic.cli import main

raise SystemExit(main(["demo", *sys.argv[1:]]))
