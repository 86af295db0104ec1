import sys
from pathlib import Path

# tests/factories.py is imported as a plain module by the test files.
sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.gpu`` tests need CUDA: skip them, with the reason, where torch sees no GPU."""
    import pytest

    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is False); run `pytest -m gpu` on a GPU host")
    for item in gpu_items:
        item.add_marker(skip)
