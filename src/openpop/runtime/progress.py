"""The ``Graph compilation`` progress bar (``Options.showCompilationProgressBar``, on by default).

PopTorch always prints it on stderr, also when stderr is a file or a pipe, and tools grep logs
for ``Graph compilation: 100%``. On a terminal openpop draws a live tqdm bar; elsewhere it
writes the finished bar once, as one plain line, when compilation ends:

    Graph compilation: 100%|██████████| 100/100 [00:01<00:00]

(an ASCII bar when the stream cannot encode block characters). A compilation that fails prints
nothing on a file (the bar on a terminal stays where it stopped).
"""
import sys
import time

BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n}/{total} [{elapsed}<{remaining}]"
DESCRIPTION = "Graph compilation"
TOTAL = 100


class CompilationProgress:
    """Started when compilation starts; ``finish()`` when it has succeeded."""

    def __init__(self, stream=None, reason=None):
        """``reason``: why a compile happens mid-run, printed first as one line
        ``Graph compilation: <reason>`` (a second bar alone would say nothing of why)."""
        self._stream = stream if stream is not None else sys.stderr
        if reason:
            print(f"{DESCRIPTION}: {reason}", file=self._stream, flush=True)
        self._started = time.perf_counter()
        self._live = None
        if _is_terminal(self._stream):
            from tqdm import tqdm
            self._live = tqdm(total=TOTAL, desc=DESCRIPTION, file=self._stream, leave=True, bar_format=BAR_FORMAT)

    def finish(self) -> None:
        if self._live is not None:
            self._live.update(TOTAL - self._live.n)
            self._live.close()
            return
        from tqdm import tqdm
        line = tqdm.format_meter(TOTAL, TOTAL, time.perf_counter() - self._started, prefix=DESCRIPTION,
                                 bar_format=BAR_FORMAT, ascii=not _encodes_blocks(self._stream))
        print(line, file=self._stream, flush=True)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _encodes_blocks(stream) -> bool:
    try:
        "█".encode(getattr(stream, "encoding", None) or "utf-8")
        return True
    except (UnicodeEncodeError, LookupError):
        return False
