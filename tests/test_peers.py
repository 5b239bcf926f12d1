"""Peer converters: the official MDLM / Duo layouts map onto replaid's TokenDiT exactly.

The fixtures were produced by the peers' own code (tests/fixtures/peers/README.md); the converted
networks must reproduce the peers' float32 logits to 1e-5.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from replaid.cli import main
from replaid.hub import peers
from replaid.methods import get_method
from replaid.store.checkpoint import load_model_weights

FX = Path(__file__).parent / "fixtures" / "peers"


def converted(kind):
    cfg_in, sd = peers.read_peer(FX / kind)
    shape, w = (peers.mdlm_to_tokendit if kind == "mdlm" else peers.duo_to_tokendit)(cfg_in, sd)
    model = get_method(peers.run_config(kind, shape, [])).build_model(shape["vocab"]).eval()
    load_model_weights(model, w, kind)
    return model, load_file(str(FX / kind / "expected.safetensors"))


def test_mdlm_logits_match_the_peer():
    model, e = converted("mdlm")
    with torch.no_grad():
        out = model(e["input_ids"])
    ref = e["logits"][..., :-1]  # the [MASK] output row is dropped (SUBS: -inf)
    assert out.shape == ref.shape and (out - ref).abs().max() < 1e-5
    assert ref.abs().max() > 0.3  # the fixture is not a zero network


def test_mdlm_constant_conditioning_is_needed():
    """MDLM's AdaLN at sigma = 0 matters: a wrong time MLP bias moves the logits (the fixture sees it)."""
    cfg_in, sd = peers.read_peer(FX / "mdlm")
    shape, w = peers.mdlm_to_tokendit(cfg_in, sd)
    w["cond.0.bias"] = torch.zeros_like(w["cond.0.bias"])
    model = get_method(peers.run_config("mdlm", shape, [])).build_model(shape["vocab"]).eval()
    load_model_weights(model, w, "mdlm")
    e = load_file(str(FX / "mdlm" / "expected.safetensors"))
    with torch.no_grad():
        assert (model(e["input_ids"]) - e["logits"][..., :-1]).abs().max() > 1e-2


def test_duo_logits_match_the_peer_at_its_noise_levels():
    model, e = converted("duo")
    with torch.no_grad():
        out = model(e["input_ids"], (1 - e["alpha_t"]).float())  # replaid's Duo input: 1 - alpha_t
        other = model(e["input_ids"], (1 - e["alpha_t"].flip(0)).float())
    assert (out - e["logits"]).abs().max() < 1e-5
    assert (other - e["logits"]).abs().max() > 1e-3  # the time conditioning matters


def test_time_conditioned_mdlm_and_pickles_are_refused(tmp_path):
    from replaid.store.checkpoint import CheckpointError

    cfg_in, sd = peers.read_peer(FX / "mdlm")
    with pytest.raises(CheckpointError, match="time-conditioned"):
        peers.mdlm_to_tokendit({**cfg_in, "time_conditioning": True}, sd)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match="never|not read"):
        peers.read_peer(tmp_path)


@pytest.mark.parametrize("kind", ["mdlm", "duo", "langflow"])
def test_convert_command_then_eval_and_sample(kind, tmp_path, capsys):
    tj = FX / "words.json"  # a 40-word tokenizer (the fixtures' vocabulary size)
    out = tmp_path / kind
    over = [
        "data.tokenizer=file",
        f"data.tokenizer_path={tj}",
        "data.source=stdlib",
        "data.max_docs=200",
        "eval.batch_size=4",
        "eval.t_samples=2",
    ]
    assert main(["convert", kind, str(FX / kind), "--out", str(out), "--set", *over]) == 0
    capsys.readouterr()
    assert main(["eval", str(out), "--max-batches", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["method"] == kind and res["tokens"] == 48
    assert main(["sample", str(out), "--num", "2", "--steps", "4", "--json"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
    assert main(["convert", kind, str(FX / kind), "--out", str(out), "--set", *over]) == 2  # never overwrites
    if kind == "langflow":  # the ODE likelihood with and without the chain-rule term, from the CLI
        for corr in ("on", "off"):
            assert (
                main(
                    [
                        "likelihood",
                        str(out),
                        "--num-seqs",
                        "2",
                        "--K",
                        "1",
                        "--steps",
                        "2",
                        "--selfcond-correction",
                        corr,
                        "--out",
                        str(tmp_path / f"lik-{corr}"),
                        "--json",
                    ]
                )
                == 0
            )
        a, b = (json.loads((tmp_path / f"lik-{c}" / "likelihood.json").read_text()) for c in ("on", "off"))
        assert a["gamma_0"] == pytest.approx(2.6411633) and a["selfcond_correction"] and not b["selfcond_correction"]


def test_langflow_logits_match_the_peer_with_and_without_self_conditioning():
    m = peers.langflow_to_denoiser(FX / "langflow")
    e = load_file(str(FX / "langflow" / "expected.safetensors"))
    with torch.no_grad():
        a = m(e["z"], e["gamma"], None).logits
        b = m(e["z"], e["gamma"], e["x_self_cond"]).logits
    assert (a - e["logits_no_sc"]).abs().max() < 1e-5 and (b - e["logits_sc"]).abs().max() < 1e-5
    assert (e["logits_sc"] - e["logits_no_sc"]).abs().max() > 1e-2  # the self-conditioning path is exercised
    g0, g1 = m.schedule.endpoints()
    gam, _ = m.schedule(torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert gam.tolist() == pytest.approx([g0, g1])


def test_langflow_ode_likelihood_with_and_without_the_chain_rule_term():
    from replaid.eval.likelihood import ode_log_weight

    m = peers.langflow_to_denoiser(FX / "langflow")
    e = load_file(str(FX / "langflow" / "expected.safetensors"))
    g0, g1 = m.schedule.endpoints()
    out = {}
    for corr in (True, False):
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            r = ode_log_weight(m, e["input_ids"], g0, g1, steps=4, generator=gen, selfcond_correction=corr)
        assert torch.isfinite(r["log_w"]).all()
        out[corr] = r["div_int"]
    assert not torch.allclose(out[True], out[False])  # the chain-rule term changes the divergence


def test_langflow_method_is_not_trainable_and_writes_nothing(tmp_path, capsys):
    assert main(["train", "--preset", "debug", "--out", str(tmp_path / "x"), "method=langflow"]) == 2
    assert "cannot be trained" in capsys.readouterr().err and not (tmp_path / "x").exists()
