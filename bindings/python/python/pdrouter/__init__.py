"""pdrouter: a router for prefill/decode-disaggregated LLM serving, in this Python process.

The ``pdrouter`` console script, ``python -m pdrouter`` and :func:`main` run the ``pdrouter``
command line exactly as the binary does (``launch`` is the default subcommand; ``demo``; the
same flags, messages and exit codes). :class:`Router` and :func:`start` run a router in the
background of a Python program and stop it on request. The name lists come from the Rust
crates, so they always match what the flags accept.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import List, Optional, Sequence

from ._pdrouter import Router, __version__, policies, reasoning_parsers, tool_call_parsers
from ._pdrouter import run as _run

__all__ = [
    "Router",
    "__version__",
    "main",
    "policies",
    "reasoning_parsers",
    "start",
    "tool_call_parsers",
]

# The program name clap prints in usage lines: the binary's, whatever launched us
# (``python -m pdrouter`` would otherwise show ``__main__.py``).
_PROGRAM = "pdrouter"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the ``pdrouter`` command line ``argv`` (default ``sys.argv[1:]``) to its end and
    returns its exit code: 0, 1 when the router cannot start, 2 for argument errors.

    ``launch`` serves until SIGTERM or SIGINT and then shuts down gracefully. As in the
    binary, both signals have their default action until the router listens: Python's
    KeyboardInterrupt handler is set aside while the command runs (and put back after).
    """
    args: List[str] = [_PROGRAM, *(sys.argv[1:] if argv is None else argv)]
    saved = []
    # Signal dispositions can only be changed from the main thread.
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            saved.append((sig, signal.signal(sig, signal.SIG_DFL)))
    try:
        return _run(args)
    finally:
        for sig, handler in saved:
            signal.signal(sig, handler)


def start(args: Sequence[str], timeout: Optional[float] = 60.0) -> Router:
    """Starts a router from ``launch``'s flags (``args``, without the program name) and
    returns it once it listens (its URL is ``router.url``).

    Raises ValueError for flags the binary would refuse (the same message), RuntimeError if
    the router cannot start, TimeoutError if it does not listen within ``timeout`` seconds
    (the router is stopped then). Stop it with ``router.stop()`` or a ``with`` block.
    """
    router = Router(list(args))
    try:
        router.wait_ready(timeout)
    except BaseException:
        router.stop()
        raise
    return router
