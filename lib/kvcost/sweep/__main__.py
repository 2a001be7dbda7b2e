"""``python -m kvcost.sweep``: see :mod:`kvcost.sweep.cli`."""
import sys

from kvcost.sweep.cli import main

sys.exit(main())
