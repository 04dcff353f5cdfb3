"""``python -m kbtorch``: the ``kbtorch`` command (for environments without the console script)."""
import sys

from .cli import main

# NOTE: guarded: a spawned worker (``serve --step-workers``) imports this module again as ``__mp_main__``.
if __name__ == "__main__":
    sys.exit(main())
