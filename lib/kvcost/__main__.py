"""``python -m kvcost``: the command line (see :mod:`kvcost.cli`)."""
from kvcost.cli import main

raise SystemExit(main())
