"""Whether the other hosts of a multi-host poprun answer at all, before the rendezvous waits for them.

The rendezvous waits ``--rendezvous-timeout`` (300 s) for every host's poprun, which is right for
a host where poprun starts late but long for a host that is down, unreachable or behind a
firewall that drops packets. So poprun first opens a TCP connection to every other host of
``--host`` at the rendezvous port, all hosts at once:

* a connection, or a refusal (RST: nothing listens there yet, or a firewall rejects), is an
  answer: the host is up and reachable, and the rendezvous waits for its poprun as before;
* silence (connection attempts time out) or an ICMP error (no route to host, network
  unreachable) until ``--host-answer-timeout`` seconds (default 15) have passed: the host does
  not answer and poprun stops, naming it.

Only a generous timeout decides (every attempt is retried until it passes), not the machine's
load. A host whose firewall silently drops the rendezvous port looks down even if it is up;
``--host-answer-timeout 0`` skips the check.
"""
import errno
import os
import socket
import threading
import time

ATTEMPT_SECONDS = 3.0   # one connection attempt (SYN retransmits after 1 s and 3 s)
RETRY_SECONDS = 0.5     # pause after an attempt that failed at once (an ICMP error)


def _addresses(host: str, port: int) -> list:
    try:
        return [info[4] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
    except socket.gaierror:
        return []


def _attempt(family_address, timeout: float):
    """None if the host answered (connected or refused), else why not."""
    family = socket.AF_INET6 if len(family_address) == 4 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.connect(family_address)
        except ConnectionRefusedError:
            return None
        except (socket.timeout, TimeoutError):
            return "timed out"
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED:
                return None
            return exc.strerror or os.strerror(exc.errno or 0) or str(exc)
        return None


def host_answers(host: str, port: int, seconds: float):
    """``(None, None)`` once ``host`` answers on ``port``; ``(address, reason)`` if it has not after
    ``seconds``."""
    deadline = time.monotonic() + seconds
    last = (host, "timed out")
    while True:
        for address in _addresses(host, port) or [None]:
            left = deadline - time.monotonic()
            if left <= 0:
                return last
            if address is None:
                last = (host, "its name does not resolve")
                time.sleep(min(RETRY_SECONDS, left))
                continue
            started = time.monotonic()
            reason = _attempt(address, min(ATTEMPT_SECONDS, left))
            if reason is None:
                return None, None
            last = (address[0], reason)
            if time.monotonic() - started < RETRY_SECONDS:
                time.sleep(min(RETRY_SECONDS, max(0.0, deadline - time.monotonic())))


def silent_hosts(hosts, port: int, seconds: float) -> list:
    """``[(host, address, reason)]`` for the hosts of ``hosts`` that do not answer on ``port``
    within ``seconds`` (all probed at once), in the order of ``hosts``."""
    results = {}

    def probe(host):
        results[host] = host_answers(host, port, seconds)

    threads = [threading.Thread(target=probe, args=(host,), daemon=True) for host in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [(host, *results[host]) for host in hosts if results[host][0] is not None]
