import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory):
    """One token/tokenizer cache per test session (never the user's ~/.cache)."""
    if "REPLAID_CACHE_DIR" not in os.environ:
        os.environ["REPLAID_CACHE_DIR"] = str(tmp_path_factory.mktemp("replaid-cache"))
    yield


@pytest.fixture
def shared() -> Path:
    if not (SHARED / "data").is_dir():
        pytest.skip("../shared (data and tokenizers) is not beside the checkout")
    return SHARED
