"""What the weight-swap route's tests share: a tiny target with two drafters, a builtin server on 127.0.0.1
in a thread, and a scripted HTTP server (a handler class of the test's own, started and stopped here)."""

from __future__ import annotations

import contextlib
import shutil
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftlab.models.target import read_config
from draftlab.serving.server import load_state, make_server
from factories import tiny_drafter_config, write_drafter
from httpcall import ScriptedHTTPServer, send_json
from tiny_models import tiny_target


def edited(src: Path, dest: Path) -> Path:
    """``src``'s drafter with one weight changed (same d2t: an SGLang launch serves both)."""
    shutil.copytree(src, dest)
    f = next(dest.glob("*.safetensors"))
    t = load_file(str(f))
    t["fc.weight"] = t["fc.weight"] + 0.5
    save_file(t, str(f))
    return dest


def tiny_folders(root: Path) -> dict[str, Path]:
    """A tiny target, its drafter, and ``other``: the drafter with one weight changed."""
    torch.set_num_threads(1)
    target = tiny_target(root / "target", seed=0)
    drafter = write_drafter(root / "drafter", tiny_drafter_config(read_config(target)), seed=1)
    return {"target": target, "drafter": drafter, "other": edited(drafter, root / "other")}


@contextlib.contextmanager
def served(folders, keys=None, **limits):
    """The builtin server of ``folders`` (target + drafter) on 127.0.0.1, in a thread: yields its URL."""
    state = load_state(folders["target"], folders["drafter"], num_steps=2, **limits)
    httpd = make_server(state, "127.0.0.1", 0, keys)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


class JsonHandler(BaseHTTPRequestHandler):
    """A scripted handler's plumbing: no log lines, and a JSON answer with its length."""

    def log_message(self, *args):
        pass

    def send_json(self, body, status: int = 200) -> None:
        send_json(self, status, body)


class Scripted:
    """A real HTTP server on 127.0.0.1 answering with ``handler`` (a :class:`JsonHandler` subclass)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.httpd = ScriptedHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
