"""python -m tests.soak: the long soak (tests/soak/__init__.py)."""

import sys

from .driver import main

sys.exit(main())
