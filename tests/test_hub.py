"""Export round trip, loading an exported folder (CLI, Python, transformers) and Hub-id resolution."""

import json

import pytest
import torch

from replaid.cli import main


@pytest.fixture(scope="module")
def run_and_export(tmp_path_factory):
    d = tmp_path_factory.mktemp("hub")
    assert (
        main(
            [
                "train",
                "--preset",
                "debug",
                "--out",
                str(d / "run"),
                "--no-progress",
                "train.steps=6",
                "train.num_threads=1",
            ]
        )
        == 0
    )
    assert main(["export", str(d / "run"), "--out", str(d / "exp")]) == 0
    return d / "run", d / "exp"


def _eval(path, capsys, *extra):
    capsys.readouterr()
    assert main(["eval", str(path), "--json", *extra]) == 0
    res = json.loads(capsys.readouterr().out)
    return {k: v for k, v in res.items() if k not in ("checkpoint", "seconds")}


def test_export_layout_and_card(run_and_export):
    run, exp = run_and_export
    names = {p.name for p in exp.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "state.json",
        "tokenizer",
        "tokenizer.json",
        "tokenizer_config.json",
        "modeling_replaid.py",
        "README.md",
    } <= names
    cfg = json.loads((exp / "config.json").read_text())
    assert cfg["model_type"] == "replaid" and cfg["auto_map"]["AutoModel"] == "modeling_replaid.ReplaidModel"
    card = (exp / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: replaid\n") and "nelbo_ppl" in card


def test_exported_folder_evaluates_identically(run_and_export, capsys):
    run, exp = run_and_export
    assert _eval(run, capsys) == _eval(exp, capsys)


def test_raw_export_holds_the_trained_weights(run_and_export, tmp_path):
    from safetensors.torch import load_file

    run, _ = run_and_export
    assert main(["export", str(run), "--out", str(tmp_path / "raw"), "--raw"]) == 0
    ck = next((run / "checkpoints").glob("step_*"))
    raw, model = load_file(str(tmp_path / "raw" / "model.safetensors")), load_file(str(ck / "model.safetensors"))
    assert all(torch.equal(raw[k], model[k]) for k in model)
    assert json.loads((tmp_path / "raw" / "state.json").read_text())["weights"] == "raw"


def test_export_never_overwrites(run_and_export, capsys):
    run, exp = run_and_export
    before = (exp / "model.safetensors").read_bytes()
    assert main(["export", str(run), "--out", str(exp)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (exp / "model.safetensors").read_bytes() == before


def test_python_and_transformers_loading(run_and_export):
    from transformers import AutoModel

    import replaid.hub

    run, exp = run_and_export
    r = replaid.hub.from_pretrained(exp)
    assert r.method.name == "replaid" and r.tokenizer.encode("Return the") == replaid.hub.from_pretrained(
        run
    ).tokenizer.encode("Return the")
    m = AutoModel.from_pretrained(str(exp), trust_remote_code=True)
    a, b = m.net.state_dict(), r.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_hub_ids_resolve_offline_to_one_line_errors(monkeypatch, capsys, tmp_path):
    from replaid.hub import looks_like_hub_id

    assert looks_like_hub_id("kuleshov-group/mdlm-owt") and looks_like_hub_id("a/b@main")
    assert not looks_like_hub_id("runs/demo/checkpoints/step_1") and not looks_like_hub_id("./a/b")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    assert main(["eval", "nobody-xyz/not-a-model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hf download nobody-xyz/not-a-model" in err[0]


def test_hub_id_is_read_from_the_local_cache(run_and_export, monkeypatch, tmp_path, capsys):
    """A snapshot in the Hub cache layout loads by its id while offline."""
    import shutil

    import huggingface_hub.constants as c

    run, exp = run_and_export
    snap = tmp_path / "models--someone--tiny" / "snapshots" / ("0" * 40)
    shutil.copytree(exp, snap)
    (tmp_path / "models--someone--tiny" / "refs").mkdir()
    (tmp_path / "models--someone--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    assert _eval("someone/tiny", capsys) == _eval(exp, capsys)
