import os
from pathlib import Path

import pytest
import torch

SHARED = Path(os.environ.get("LADDER_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))


@pytest.fixture(autouse=True)
def _fp32_single_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"../shared not found at {SHARED}: the local tokenizer and data samples are needed")
    return SHARED
