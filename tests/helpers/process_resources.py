"""What processes hold, read from /proc: resident memory, open file descriptors, the shared
memory (/dev/shm) they map or keep open, their children. Linux only (the soak tests)."""
import os

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_kib(pid="self") -> int:
    """Anonymous resident memory, KiB: ``/proc/<pid>/statm``'s resident pages less its shared
    ones. The shared ones are file-backed (libtorch's code: the kernel drops them under memory
    pressure and reads them back at their next use, 70 MB either way on a busy machine) and
    shared memory (measured by ``shm_files``)."""
    with open(f"/proc/{pid}/statm") as stream:
        _, resident, shared = (int(field) for field in stream.read().split()[:3])
    return (resident - shared) * PAGE // 1024


def fd_targets(pid="self") -> list:
    """What each open file descriptor of ``pid`` points at (``pipe:[...]``, a path, ...)."""
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed while listed (the listing's own descriptor among them)
            pass
    return sorted(targets)


def descendants(pid) -> list:
    """``pid``'s children, their children, ..."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as stream:
                children = [int(child) for child in stream.read().split()]
        except OSError:
            continue
        for child in children:
            found += [child] + descendants(child)
    return found


def shm_files(pids) -> dict:
    """``{(device, inode): bytes}`` of the /dev/shm files that ``pids`` map or hold open, each
    counted once (torch unlinks its segments once they are mapped: deleted ones count too)."""
    files = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as stream:
                for line in stream:
                    if "/dev/shm/" in line:
                        fields = line.split(None, 5)
                        start, end = (int(v, 16) for v in fields[0].split("-"))
                        files[fields[3], fields[4]] = max(files.get((fields[3], fields[4]), 0), end - start)
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # the process ended
            continue
        for fd in descriptors:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/"):
                    status = os.stat(f"/proc/{pid}/fd/{fd}")
                    key = (f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}", str(status.st_ino))
                    files[key] = max(files.get(key, 0), status.st_size)
            except OSError:
                pass
    return files


def named_shm(pids) -> list:
    """/dev/shm files named after one of ``pids`` (torch's ``torch_<pid>_*``, multiprocessing's
    ``pym-<pid>-*``): what a process left behind when it died before unlinking them."""
    marks = tuple(f"torch_{pid}_" for pid in pids) + tuple(f"pym-{pid}-" for pid in pids)
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(marks))


def tree(pids) -> dict:
    """RSS (KiB), open fds and /dev/shm bytes of the processes ``pids`` together."""
    alive = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
    return {"rss_kib": sum(rss_kib(pid) for pid in alive), "fds": sum(len(fd_targets(pid)) for pid in alive),
            "shm_bytes": sum(shm_files(alive).values())}
