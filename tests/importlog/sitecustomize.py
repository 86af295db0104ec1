"""Test-only: with this folder on PYTHONPATH and $DRAFTLAB_TEST_IMPORT_LOG naming a folder, every Python
process that exits normally writes its argv and the top-level modules it imported there (one JSON file
per process). tests/test_e2e.py runs the smoke workflow so, to check each conda env file against
what its rules' commands really import (lazy imports included)."""

import atexit
import json
import os
import sys

_LOG = os.environ.get("DRAFTLAB_TEST_IMPORT_LOG")


def _write() -> None:
    modules = sorted({name.split(".")[0] for name in list(sys.modules) if name and not name.startswith("_")})
    path = os.path.join(_LOG, f"{os.getpid()}.json")
    try:
        with open(path + ".tmp", "w") as fh:
            json.dump({"argv": sys.argv, "modules": modules}, fh)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


if _LOG:
    atexit.register(_write)
