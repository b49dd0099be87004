"""Types of the Rust extension ``pdrouter._pdrouter`` (bindings/python/src/lib.rs)."""

from types import TracebackType
from typing import List, Optional, Sequence, Type

__version__: str

def run(argv: Sequence[str]) -> int:
    """Runs the pdrouter command line ``argv`` (program name first); returns the exit code."""

def policies() -> List[str]:
    """The routing policy names ``--policy`` takes."""

def tool_call_parsers() -> List[str]:
    """The tool-call parser names ``--tool-call-parser`` takes (canonical names)."""

def reasoning_parsers() -> List[str]:
    """The reasoning parser names ``--reasoning-parser`` takes (canonical names)."""

class Router:
    """A router started from ``launch``'s flags, serving in the background."""

    def __init__(self, args: Sequence[str]) -> None: ...
    def wait_ready(self, timeout: Optional[float] = None) -> str:
        """Waits until the router listens; returns its URL."""
    def stop(self, timeout: Optional[float] = None) -> None:
        """Shuts the router down gracefully and waits for it."""
    @property
    def url(self) -> Optional[str]: ...
    @property
    def metrics_url(self) -> Optional[str]: ...
    @property
    def running(self) -> bool: ...
    def __enter__(self) -> "Router": ...
    def __exit__(
        self,
        kind: Optional[Type[BaseException]],
        value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> bool: ...
