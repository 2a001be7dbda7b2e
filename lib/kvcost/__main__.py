"""``python -m kvcost``: the command line (see :mod:`kvcost.cli`)."""
from .cli import main

raise SystemExit(main())
