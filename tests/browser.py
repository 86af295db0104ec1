"""Headless Chromium for tests that read a page the way a person's browser shows it.

Debian's `chromium` package (`.ci/run` installs it). Tests that need it skip only when it is not
installed. Runs as its own process group in a throwaway profile and is always stopped.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if path is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium; .ci/run installs it)")
    return path


def _run(args: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="draftlab-chromium-") as profile:
        cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
               "--virtual-time-budget=15000", *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"chromium did not finish within {timeout} s: {err[-2000:]}") from None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def dump_dom(page: Path) -> str:
    """The DOM after the page's scripts ran (what is rendered, not the file's source)."""
    res = _run(["--dump-dom", page.resolve().as_uri()])
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def visible_text(page: Path) -> str:
    """The text of the rendered DOM, without script and style sources."""
    dom = dump_dom(page)
    import html
    import re

    dom = re.sub(r"(?is)<(script|style)[^>]*>.*?</\1>", " ", dom)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


def screenshot(page: Path, out: Path, width: int = 1400, height: int = 1000) -> Path:
    res = _run([f"--screenshot={out}", f"--window-size={width},{height}", "--hide-scrollbars",
                page.resolve().as_uri()])
    assert res.returncode == 0 and out.is_file(), res.stderr[-2000:]
    return out
