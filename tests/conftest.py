import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        help="device of the device-aware tests (samplers, likelihood, method contract, compile): "
        "cpu (default) or cuda[:N]; scripts/gpu_check.sh runs them with --device cuda",
    )


def pytest_configure(config):
    name = config.getoption("--device")
    if name == "cpu":
        return
    import torch

    try:
        dev = torch.device(name)
    except RuntimeError:
        raise pytest.UsageError(f"--device {name!r} is not a device; use cpu or cuda[:N]") from None
    if dev.type != "cuda":
        raise pytest.UsageError(f"--device {name!r}: the device-aware tests run on cpu or cuda[:N]")
    if not torch.cuda.is_available():
        raise pytest.UsageError(f"--device {name}: this machine has no CUDA device; leave --device out (cpu)")


@pytest.fixture(scope="session")
def device(request):
    """The device of the device-aware tests (``--device``, cpu by default)."""
    import torch

    return torch.device(request.config.getoption("--device"))


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
