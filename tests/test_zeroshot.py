"""Zero-shot suite: MDLM's detokenisers, row conventions, [BOS]...[EOS] wrapping, float64 aggregation, CLI."""

import json
import math

import numpy as np
import pytest
import torch

from replaid.cli import main
from replaid.data import zeroshot as Z


def test_wikitext_detokenizer_rules():
    s = ' = = Early life = = \n The men \'s 1 @,@ 000 @-@ strong army ( 3 @.@ 5 km ) won , " he said " . \n'
    assert Z.wt_detokenizer(s) == ' == Early life ==\nThe men\'s 1,000-strong army (3.5 km) won, "he said".\n'
    assert Z.wt_detokenizer(" in N years ") == " in 1 years "


def test_ptb_lm1b_lambada_and_papers_detokenizers():
    assert (
        Z.ptb_detokenizer("the company 's shares do n't fall N N to $ N a\\/b <unk>")
        == "the company's shares don't fall 1 1 to $1 a/b ?"
    )
    assert (
        Z.lm1b_detokenizer('see http : / / x.org , he said " yes " ( ok ) .')
        == 'see http://x.org, he said "yes" (ok) .'
    )
    assert Z.lm1b_detokenizer("He won .") == "He won."
    assert Z.lambada_detokenizer("  “Hi,” she said  ") == '\n"Hi," she said'
    s = "a @-@ b , c"
    assert Z.scientific_papers_detokenizer(s) == Z.lm1b_detokenizer(Z.wt_detokenizer(s)) == "a-b, c"


def test_local_rows_follow_the_hub_builders(tmp_path):
    (tmp_path / "wikitext2").mkdir()
    (tmp_path / "wikitext2" / "valid.txt").write_text(" \n = A = \n \n B c . \n")
    (tmp_path / "ptb").mkdir()
    (tmp_path / "ptb" / "valid.txt").write_text(" a b \n c N d \n")
    docs, src = Z.load_documents("wikitext2", None, str(tmp_path))
    assert src.endswith("wikitext2/valid.txt")
    assert docs == ["", " = A =\n", "", " B c.\n"]  # WikiText detokeniser on the file's lines
    assert Z.load_documents("ptb", "valid", str(tmp_path))[0] == ["a b", "c 1 d"]


def test_wrapping_is_bos_chunk_eos_with_remainder_dropped_per_group():
    B, E = 90, 99
    docs = [[1, 2], [3], [4, 5, 6]]
    # stream 1 2 E 3 E 4 5 6 E, chunks of L - 2 = 3
    assert Z.wrap_documents(docs, 5, B, E).tolist() == [[B, 1, 2, E, E], [B, 3, E, 4, E], [B, 5, 6, E, E]]
    # MDLM groups per datasets.map batch: [1 2 E 3 E] -> one chunk (3 E dropped), [4 5 6 E] -> one chunk
    assert Z.wrap_documents(docs, 5, B, E, group=2).tolist() == [[B, 1, 2, E, E], [B, 4, 5, 6, E]]
    assert Z.wrap_documents([[1]], 5, B, E).shape == (0, 5)


def test_unknown_set_and_missing_file_are_one_line_errors(tmp_path, capsys):
    from replaid.data import DataError

    with pytest.raises(DataError, match="unknown zero-shot dataset"):
        Z.load_documents("imdb")


class _ConstMethod:
    """Per-row bound = row index (nats/token): the suite must average tokens in float64."""

    name = "stub"

    def eval_bound(self, model, tokens, gen):
        return {"nelbo": tokens[:, 1].double()}


def test_ppl_is_the_token_weighted_mean_in_float64(tmp_path):
    from types import SimpleNamespace

    from replaid.config import RunConfig
    from replaid.eval.zeroshot import zeroshot_run

    (tmp_path / "ptb").mkdir()
    (tmp_path / "ptb" / "valid.txt").write_text("".join(f"w{i}\n" for i in range(7)))

    class Tok:
        eos_id, pad_id, name = 0, None, "stub"

        def encode_batch(self, texts):
            return [[int(t[1:]) + 1] for t in texts]

    cfg = RunConfig()
    cfg.data.seq_len = 4  # two tokens a row: docs "wi" -> [i+1, EOS]
    run = SimpleNamespace(cfg=cfg, tokenizer=Tok(), model=torch.nn.Linear(1, 1), method=_ConstMethod())
    res = zeroshot_run(run, ["ptb"], str(tmp_path), batch_size=2, progress=False)["ptb"]
    firsts = [1, 2, 3, 4, 5, 6, 7]  # row r starts with token r+1 (detokenised "w1 ..." stays)
    assert res["rows"] == 7 and res["tokens"] == 28
    assert res["nats_per_token"] == pytest.approx(np.mean(np.array(firsts, dtype=np.float64)), rel=1e-15)
    assert res["ppl"] == pytest.approx(math.exp(4.0))


def test_zeroshot_command_on_an_ar_run(tmp_path, capsys, monkeypatch):
    (tmp_path / "zs" / "wikitext2").mkdir(parents=True)
    (tmp_path / "zs" / "wikitext2" / "valid.txt").write_text(" = Title = \n \n Return the value of the key . \n" * 40)
    assert (
        main(
            [
                "train",
                "--preset",
                "debug",
                "--method",
                "ar",
                "--out",
                str(tmp_path / "ar"),
                "--no-progress",
                "train.steps=2",
                "train.num_threads=1",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        main(
            [
                "zeroshot",
                str(tmp_path / "ar"),
                "--datasets",
                "wikitext2",
                "--data-dir",
                str(tmp_path / "zs"),
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    res = json.loads((tmp_path / "out" / "zeroshot.json").read_text())
    d = next(iter(res.values()))["datasets"]["wikitext2"]
    assert d["bound"] == "exact NLL" and d["rows"] > 0 and math.isclose(d["ppl"], math.exp(d["nats_per_token"]))
    assert "| wikitext2 |" in (tmp_path / "out" / "zeroshot.md").read_text()
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # no network: fail at once
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert main(["zeroshot", str(tmp_path / "ar"), "--datasets", "ptb", "--data-dir", str(tmp_path / "zs")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("replaid: error:")]
    assert len(err) == 1 and "ptb/validation.txt" in err[0]
