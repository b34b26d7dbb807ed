"""``python -m ragpic.demo`` runs ``ragpic demo`` (same options, checks and exit codes)."""

import sys

from ragpic.demo.options import main

raise SystemExit(main(sys.argv[1:]))
