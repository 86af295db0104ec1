"""What a running server says about itself: its speculative settings (``/server_info``) and the model
it serves (``/v1/models``). Read by bench (the bounds of its answers, the record), generate-data (which
model answers) and anything else that meets a server, through draftlab's one HTTP client.
"""

from __future__ import annotations

from typing import Any

from draftlab.errors import DraftlabError
from draftlab import http_client

SERVER_INFO_PATHS = ("/server_info", "/get_server_info")  # SGLang 0.5.23 deprecates the second (a warning per call)
SERVER_INFO_KEYS = ("model_path", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
                    "speculative_eagle_topk", "speculative_num_draft_tokens", "version")


def server_info(url: str, timeout: float) -> dict[str, Any]:
    """Speculative settings and SGLang's own cumulative accept length, when the server tells.

    ``/server_info`` first, then ``/get_server_info`` (older SGLang); a server that has neither gives
    ``{}``. An answer of the wrong shape (not an object, ``internal_states`` not a list of objects)
    is one error line, not a fallback: the server answered, wrongly.
    """
    for path in SERVER_INFO_PATHS:
        try:
            info = http_client.read_json(f"{url}{path}", timeout)
        except (http_client.RequestTimeout, http_client.BadResponse):
            raise  # a server too slow (or too broken) to describe itself will not be benchmarked either
        except DraftlabError:
            continue  # no such endpoint here (HTTP 404), or not reachable: the requests will tell
        doc = info.expect("object")
        keep = {k: doc.get(k) for k in SERVER_INFO_KEYS if k in doc}
        states = info.field("internal_states", "list", required=False)
        if states is not None and states.value:
            avg = states.item(0).get("avg_spec_accept_length", "number")
            if avg is not None:
                keep["avg_spec_accept_length"] = avg
        keep["endpoint"] = path
        return keep
    return {}


def served_model(url: str, timeout: float) -> str:
    """The first model ``/v1/models`` lists (its ``data[0].id``)."""
    where = f"{url}/v1/models"
    data = http_client.read_json(where, timeout).field("data", "list", required=False)
    if data is None or not data.value:
        raise DraftlabError(f"{where}: key 'data': expected at least one served model (or pass --model)")
    return data.item(0).get("id", "str", required=True)
