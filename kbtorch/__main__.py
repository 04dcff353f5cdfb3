"""``python -m kbtorch``: the ``kbtorch`` command (for environments without the console script)."""
import sys

from .cli import main

sys.exit(main())
