"""``python -m pdrouter.launch_router``: ``pdrouter launch`` under the module path SMG users
know from ``python -m smg.launch_router``; it takes ``launch``'s flags."""

import sys
from typing import Optional, Sequence

import pdrouter


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs ``pdrouter launch`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    return pdrouter.main(["launch", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
