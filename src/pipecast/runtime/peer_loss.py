"""How a connection to another rank failed, in pipecast's words rather than the backend's.

gloo's errors name its source file and line, tell the reader to check the remote worker's
logs, and end "GLHF! 🏖️"; pipecast kept a prefix of them, cut mid-word. A rank that loses
a peer says instead what it was doing (the caller) and, here, how the connection failed.
"""

from __future__ import annotations

CAUSES = (
    (("closed by peer", "reset by peer", "broken pipe", "socket closed"),
     "the rank at the other end closed the connection (did its process end?)"),
    (("connection refused", "connect timeout"),
     "the rank at the other end could not be reached (did its process end?)"),
    (("timed out", "timeout"), "it timed out waiting for the rank at the other end"),
    (("read error", "write error"), "the connection to the rank at the other end failed"),
)  # fmt: skip
"""What gloo's and the TCP stack's words for a lost connection (lower case) mean, in ours."""


def how_lost(exc: BaseException) -> str:
    """How the connection under `exc` (a backend's error) failed, in a few words: for a
    cause gloo names, pipecast's words alone; otherwise the backend's first line, whole
    (NCCL's, say, which names a CUDA error worth reading)."""
    text = str(exc)
    lower = text.lower()
    for words, cause in CAUSES:
        if any(w in lower for w in words):
            return cause
    if "gloo" in lower:
        return "the connection to the rank at the other end failed"
    return (text.strip().splitlines() or [type(exc).__name__])[0]
