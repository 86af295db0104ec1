"""A server dies with the process that started it, however that process died.

Teardown code (:func:`draftlab.serving.launch.stop_group`) runs only when its process gets to run it:
a SIGKILL (the OOM killer, a cluster's time limit, ``kill -9`` on Snakemake's process group) skips it,
and a server in its own session would stay up with parent pid 1, holding its port and its GPUs. Two
guards, each enough alone:

- the Linux parent-death signal (``prctl(PR_SET_PDEATHSIG)``), set in the server process between fork
  and exec: the kernel sends SIGTERM to the server's leader when its parent dies. It fires when the
  *thread* that forked exits, so it is set only for a launch from the main thread;
- a watch process in a session of its own (so a signal to the starter's process group misses it),
  reading a pipe whose only write end the starter holds: EOF means the starter is gone, and the watch
  sends SIGTERM to the server's whole process group (SGLang's TP workers too), then SIGKILL after the
  grace, and exits. Run as ``python -m draftlab.serving.parent_watch PGID GRACE_S``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
RELEASE = b"r"  # what the starter writes to the pipe once it has torn the group down itself


def death_signal_preexec(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks the kernel for ``sig`` when the starter dies, or None where it cannot
    hold (not Linux, or not the main thread: the signal would fire when that thread ends)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before fork: the child only calls it
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the starter died before the signal was set: nobody will send it
            os._exit(128 + int(sig))

    return preexec


class Watch:
    """The running watch of one server group; :meth:`release` ends it after a normal teardown."""

    def __init__(self, proc: subprocess.Popen, write_fd: int):
        self.proc, self._fd = proc, write_fd

    def release(self) -> None:
        """Stand the watch down after a normal teardown (the group is gone: a pid reused since must not be
        signalled), and reap it."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.write(self._fd, RELEASE)
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def watch_group(pgid: int, grace_s: float) -> Watch | None:
    """Start the watch of process group ``pgid``; None where it cannot start (the parent-death signal
    still holds)."""
    read_fd, write_fd = os.pipe()  # both non-inheritable: the server never holds the write end
    try:
        proc = subprocess.Popen([sys.executable, "-m", __name__, str(pgid), repr(float(grace_s))],
                                stdin=read_fd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError:
        os.close(write_fd)
        return None
    finally:
        os.close(read_fd)
    return Watch(proc, write_fd)


def _members(pgid: int) -> list[int]:
    """Live (not zombie) processes of group ``pgid`` other than this one, read from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                out.append(int(entry.name))
    return out


def _kill_group(pgid: int, grace_s: float) -> None:
    """SIGTERM to the group, SIGKILL to what is left after ``grace_s``."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _members(pgid):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    pgid, grace_s = int(argv[0]), float(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:  # blocks until the starter releases the watch, or every write end is closed (it died)
        try:
            data = os.read(0, 4096)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if RELEASE in data:
            return 0
        if not data:
            break
    _kill_group(pgid, grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
