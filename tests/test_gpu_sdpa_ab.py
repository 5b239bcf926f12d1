"""benchmarks/gpu_sdpa_ab.py: its "all" arm really lifts the model's cached-attention policy (else the A/B
would time the same code twice), and both parts run and write every arm at debug size on the CPU."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_sdpa_ab.py"


@pytest.fixture(scope="module")
def ab():
    spec = importlib.util.spec_from_file_location("gpu_sdpa_ab", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("gpu_sdpa_ab", None)


def test_the_all_arm_lifts_the_policy_and_the_other_keeps_it(ab):
    from replaid.model import dit, plaid_backbone

    policy = dit.cached_sdpa
    for module in (dit, plaid_backbone):
        with ab.backends("all"), module.cached_sdpa(torch.device("cuda")):
            assert torch.backends.cuda.cudnn_sdp_enabled()
    with ab.backends("no_cudnn"):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        with dit.cached_sdpa(torch.device("cuda")):
            assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert dit.cached_sdpa is policy and plaid_backbone.cached_sdpa is policy
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_both_parts_write_every_arm(ab, tmp_path, monkeypatch):
    small = ["--device", "cpu", "--preset", "debug", "--batches", "1", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", ["gpu_sdpa_ab.py", *small, "--ar-tokens", "3", "--block-tokens", "16"])
    assert ab.main() == 0
    rows = json.loads((tmp_path / "sdpa_ab.json").read_text())["rows"]
    assert [(r["family"], r["sdpa"]) for r in rows] == [("ar", "all")] * 2 + [("ar", "no_cudnn")] * 2 + [
        ("blocks", "all"),
        ("blocks", "no_cudnn"),
    ] * 2
    assert all(r.get("ms_per_call", r.get("ms_per_nfe", 0)) > 0 for r in rows)
    monkeypatch.setattr(sys, "argv", ["gpu_sdpa_ab.py", *small, "--part", "order", "--order-tokens", "3"])
    assert ab.main() == 0
    order = json.loads((tmp_path / "sdpa_order.json").read_text())["rows"]
    assert [r["shapes"] for r in order] == ["fresh", "-", "seen", "seen"] * 2
