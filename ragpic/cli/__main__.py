"""``python -m ragpic.cli ...``: the ``ragpic`` console script."""

import sys

from ragpic.cli.main import main

sys.exit(main())
