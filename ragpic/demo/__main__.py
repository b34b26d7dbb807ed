"""``python -m ragpic.demo`` runs ``ragpic demo``."""

from ragpic.demo.app import main

raise SystemExit(main())
