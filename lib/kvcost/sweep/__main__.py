"""``python -m kvcost.sweep``: see :mod:`kvcost.sweep.cli`."""
import sys

from .cli import main

sys.exit(main())
