"""Who may call which route of the builtin server: SGLang 0.5.23's keys, read in its wheel.

SGLang (``srt/utils/auth.py::decide_request_auth``, levels set per route in ``entrypoints/http_server.py``):
``--api-key`` guards every route; ``--admin-api-key`` guards the admin-optional routes (the weight updates,
``/weights_checker``, ``/flush_cache``, ...), where it is then the only key accepted; ``/health*``,
``/ready*`` and ``/metrics*`` are always open (probes and scrapers carry no secret). The key travels as
``Authorization: Bearer KEY``, compared in constant time; a refusal is 401 ``{"error": "Unauthorized"}``.

draftlab adds one rule SGLang does not have: a server bound to a non-loopback address with no key refuses
the weight routes (403), since anyone who can reach it could otherwise replace the served drafter.
Keys come from ``--api-key``/``--admin-api-key`` or, so that no command line or log shows them, from
``DRAFTLAB_API_KEY``/``DRAFTLAB_ADMIN_API_KEY`` (what the pipeline's own launches use).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass

ENV_API_KEY = "DRAFTLAB_API_KEY"
ENV_ADMIN_API_KEY = "DRAFTLAB_ADMIN_API_KEY"
OPEN_PREFIXES = ("/health", "/ready", "/metrics")
# the builtin server's routes SGLang marks AuthLevel.ADMIN_OPTIONAL
ADMIN_ROUTES = frozenset({"/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update",
                          "/weights_checker", "/flush_cache"})
WEIGHT_ROUTES = frozenset(ADMIN_ROUTES - {"/flush_cache"})
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Keys:
    """The keys a server was started with, and whether it listens beyond this host."""

    api_key: str | None = None
    admin_api_key: str | None = None
    remote: bool = False

    @classmethod
    def for_bind(cls, host: str, api_key: str | None = None, admin_api_key: str | None = None) -> "Keys":
        """Explicit keys, else the environment's; empty strings count as none."""
        api = api_key or os.environ.get(ENV_API_KEY) or None
        admin = admin_api_key or os.environ.get(ENV_ADMIN_API_KEY) or None
        return cls(api, admin, host not in LOOPBACK)

    @property
    def weights_closed(self) -> bool:
        """A non-loopback bind with no key at all: the weight routes are refused."""
        return self.remote and not (self.api_key or self.admin_api_key)

    def startup_note(self, host: str) -> str | None:
        if self.weights_closed:
            return (f"WARNING: draftlab serve is binding {host}, reachable from other machines, with no key: the "
                    "weight routes (/begin_weight_update, /update_weights_from_tensor, /end_weight_update, "
                    f"/weights_checker) are refused. Set {ENV_API_KEY} (or --api-key) to allow drafter swaps.")
        if self.remote:
            return (f"draftlab serve is binding {host}, reachable from other machines; every route but /health, "
                    "/ready and /metrics needs its key (Authorization: Bearer KEY)")
        return None


def _bearer_matches(header: str | None, expected: str) -> bool:
    if not header:
        return False
    parts = header.split(" ", 1)
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return False
    return secrets.compare_digest(parts[1].encode(), expected.encode())


def decide(keys: Keys, method: str, path: str, authorization: str | None) -> tuple[int, dict] | None:
    """None when the request may go on, else the ``(status, body)`` to answer with."""
    if method == "OPTIONS" or path.startswith(OPEN_PREFIXES):
        return None
    if path in WEIGHT_ROUTES and keys.weights_closed:
        return 403, {"error": "Forbidden", "message": f"{path}: this server listens beyond 127.0.0.1 without a key, "
                     f"so its weight routes are refused; restart it with {ENV_API_KEY} (or --api-key) set"}
    if path in ADMIN_ROUTES:
        expected = keys.admin_api_key or keys.api_key
    else:
        expected = keys.api_key
    if expected is None or _bearer_matches(authorization, expected):
        return None
    return 401, {"error": "Unauthorized"}


def new_key() -> str:
    """A fresh key for one launch."""
    return secrets.token_urlsafe(32)
