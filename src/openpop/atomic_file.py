"""Writing a file so that readers see the old version or the new one, never a part.

``atomic_write`` writes to ``.tmp-<name>-<pid>-<random>`` beside the target and renames it into
place. A process killed mid-write (SIGKILL, power loss) cannot remove its temporary file;
``remove_stale_temporaries`` deletes those whose writer is no longer running, so a directory
that is written again and again does not fill up with them.
"""
import os
import re
import tempfile
from re import Pattern


class _FailFastStream:
    """A binary stream that remembers the first exception its ``write`` raised and raises it
    again on every later call. Serializers that call back into Python (``torch.save``) turn an
    exception from the stream into their own error (``RuntimeError: [enforce fail at
    inline_container.cc...]``) and keep writing; this stops the writing and keeps the cause."""

    def __init__(self, raw):
        self._raw = raw
        self.error = None

    def write(self, data) -> int:
        if self.error is not None:
            raise self.error
        try:
            return self._raw.write(data)
        except BaseException as exc:  # OSError (disk full, file too large) or KeyboardInterrupt (Ctrl-C)
            self.error = exc
            raise

    def flush(self) -> None:
        self._raw.flush()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._raw.fileno()


def atomic_write(path: str, write) -> None:
    """Write through ``write(stream)`` (a binary stream) to a temporary file beside ``path``,
    flush it to disk, then rename it over ``path``. The temporary file is removed on failure.

    When the stream's own ``write`` failed (``OSError`` for a full disk or the file-size limit,
    ``KeyboardInterrupt`` for Ctrl-C), that exception is raised, whatever ``write`` turned it into.
    """
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".tmp-{os.path.basename(path)}-{os.getpid()}-")
    try:
        with os.fdopen(handle, "wb") as raw:
            stream = _FailFastStream(raw)
            try:
                write(stream)
            except BaseException as exc:
                if stream.error is not None and stream.error is not exc:
                    raise stream.error from None
                raise
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


_TEMPORARY = re.compile(r"^\.tmp-(?P<name>.+?)(?:-(?P<pid>\d+))?-[a-z0-9_]+$")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temporaries(directory: str, names: Pattern) -> list[str]:
    """Delete the temporary files ``atomic_write`` left in ``directory`` for targets whose name
    matches ``names`` and whose writing process is not running on this machine (files without a
    process id are from an older openpop and always stale). Returns the paths removed.

    Decision: a writer on another machine sharing the directory is not detected; two runs writing
    the same files at once are unsupported anyway (they would overwrite each other's results)."""
    if not os.path.isdir(directory):
        return []
    removed = []
    for entry in os.listdir(directory):
        match = _TEMPORARY.match(entry)
        if not match or not names.fullmatch(match.group("name")):
            continue
        pid = match.group("pid")
        if pid is not None and _running(int(pid)):
            continue
        path = os.path.join(directory, entry)
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed
