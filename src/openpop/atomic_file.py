"""Writing a file so that readers see the old version or the new one, never a part."""
import os
import tempfile


def atomic_write(path: str, write) -> None:
    """Write through ``write(stream)`` (a binary stream) to a temporary file beside ``path``,
    flush it to disk, then rename it over ``path``. The temporary file is removed on failure."""
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-" + os.path.basename(path) + "-")
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
