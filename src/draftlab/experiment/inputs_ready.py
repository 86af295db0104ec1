"""The user's input files, checked before the first launch of the target.

Why: a dry run plans without files that are not here yet (a laptop planning a cluster run), so the DAG
leaves them out with a warning. A real run used to find a typo in ``data.prompts`` only in generate-data,
after the probe launch and the plain launch (the baseline benched, then thrown away): on a large target
with retries, an hour of launches for a typo. The Snakefile's ``onstart`` (before any job) asks this module
for every file a later stage reads and refuses a missing one in one line naming the config key and the file.
"""

from __future__ import annotations

import os

from draftlab.errors import DraftlabError
from draftlab.settings.model import Settings


def missing_inputs(settings: Settings) -> list[str]:
    """``key: path (what reads it)`` for every configured input file that is not a file here."""
    wanted: list[tuple[str, str | None, str]] = []
    if settings.arms:  # the fine-tune data is read only when an arm trains
        if settings.data.generated:
            wanted.append(("data.prompts", settings.data.prompts, "the prompts the target answers for the "
                                                                  "fine-tune data"))
        else:
            wanted.append(("data.path", settings.data.path, "the fine-tune conversations"))
    for i, c in enumerate(settings.bench.clients):
        wanted.append((f"bench.clients[{i}].prompts", c.prompts, "the prompts this client benches"))
        if c.in_domain != "demo":
            wanted.append((f"bench.clients[{i}].in_domain", c.in_domain, "the in-domain prompts this client benches"))
    return [f"{key}: {path} not found ({what})" for key, path, what in wanted
            if path and path != "default" and not os.path.isfile(path)]


def check_inputs_ready(settings: Settings) -> None:
    """Refuse, in one line, a run whose later stages would fail on a missing input file; nothing launched."""
    missing = missing_inputs(settings)
    if missing:
        raise DraftlabError("; ".join(missing) + "; nothing was launched (fix the path in the config, or create "
                            "the file, then rerun)")
