"""``python -m pdrouter``: the ``pdrouter`` command line (see :func:`pdrouter.main`)."""

import sys

from pdrouter import main

if __name__ == "__main__":
    sys.exit(main())
