"""Issue 28 beyond the hostile-input table (``test_bad_inputs.py``): the memory estimate that refuses a
sample request before allocating, checkpoint integrity (sha256 recorded, checked, ``--no-verify``),
non-finite results as errors, the sweep's refusal to swap a sampler, the shared argparse types."""

import argparse
import importlib
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from replaid.cli import main
from replaid.commands import float_in, int_in, require_finite
from replaid.presets import resolve
from replaid.store import checkpoint as ck


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("rob") / "run"
    argv = ["train", "--preset", "debug", "--out", str(run), "--no-progress", "train.steps=2", "eval.max_batches=1"]
    assert main([*argv, "train.num_threads=1"]) == 0
    return run


@pytest.mark.parametrize(
    "parse,text,ok",
    [
        (int_in(1), "16", 16),
        (int_in(1), " 7 ", 7),
        (int_in(1), "0", None),
        (int_in(1), "1e9", None),
        (int_in(1), "2.0", None),
        (int_in(0, 10), "11", None),
        (float_in(0, lo_open=True), "1e-3", 1e-3),
        (float_in(0, lo_open=True), "0", None),
        (float_in(0), "nan", None),
        (float_in(0), "inf", None),
        (float_in(0), "1e400", None),
        (float_in(0, 1, hi_open=True), "1", None),
    ],
)
def test_argparse_types_take_exact_finite_values_in_range(parse, text, ok):
    if ok is None:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)
    else:
        assert parse(text) == ok


def test_every_checkpoint_records_the_sha256_of_its_files_and_config(trained):
    c = ck.find_checkpoint(trained)
    st = ck.load_state(c)
    rec = dict(st["sha256"])
    assert rec.pop(ck.CONFIG_DIGEST) == ck.config_digest(st["config"])  # issue 49: state.json's config too
    assert sorted(rec) == sorted([p.name for p in c.glob("*.safetensors")] + ["optimizer.json"]) and len(rec) == 5
    assert all(rec[n] == ck.sha256_file(c / n) for n in rec)


def test_a_checkpoint_reached_through_a_symlink_loads_with_its_runs_tokenizer(trained, tmp_path):
    """``ln -s RUN/checkpoints/step_N name``, then ``replaid serve name``: the tokenizer is the target run's
    (it was looked for beside the link: 'has no tokenizer')."""
    from replaid.store.loading import load_run

    link = tmp_path / "named"
    link.symlink_to(sorted((trained / "checkpoints").glob("step_*"))[-1], target_is_directory=True)
    a, b = load_run(link, device="cpu"), load_run(trained, device="cpu")
    assert a.tokenizer.vocab_size == b.tokenizer.vocab_size and a.cfg.method == b.cfg.method
    ids = [5, 9, 11]
    assert a.tokenizer.decode(ids) == b.tokenizer.decode(ids)


def test_a_flipped_bit_is_named_and_no_verify_loads_anyway(trained, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    f = ck.find_checkpoint(run) / "ema.safetensors"
    b = bytearray(f.read_bytes())
    b[-5] ^= 0x01  # the last bytes are weights: the file still parses, with one changed value
    f.write_bytes(bytes(b))
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(f) in err[0] and "--no-verify" in err[0], err
    assert main(["--no-verify", "eval", str(run), "--json"]) == 0  # the flipped bit is a tiny change
    assert ck.VERIFY is False
    assert main(["eval", str(trained), "--json"]) == 0 and ck.VERIFY is True  # one call's flag, not the next's


def test_an_exported_folder_records_and_checks_its_hash(trained, tmp_path, capsys):
    out = tmp_path / "exp"
    assert main(["export", str(trained), "--out", str(out)]) == 0
    st = json.loads((out / "state.json").read_text())
    assert st["sha256"]["model.safetensors"] == ck.sha256_file(out / "model.safetensors")
    b = bytearray((out / "model.safetensors").read_bytes())
    b[-3] ^= 0x01
    (out / "model.safetensors").write_bytes(bytes(b))
    capsys.readouterr()
    assert main(["eval", str(out)]) == 2 and "does not match the sha256" in capsys.readouterr().err


def test_non_finite_results_are_an_error_naming_them():
    require_finite({"ppl": 3.0, "nested": {"bpd": 1.0}}, "run")
    with pytest.raises(ValueError, match=r"non-finite results \(ppl=inf, per_set.ptb=nan\)"):
        require_finite({"ppl": math.inf, "per_set": {"ptb": math.nan}}, "run")


def test_sample_refuses_what_cannot_fit_before_allocating(trained, monkeypatch):
    g = importlib.import_module("replaid.sampling.generate")  # the module, not its function generate
    from replaid.sampling.request import SampleRequest
    from replaid.store.loading import load_run

    run = load_run(trained)
    # 1 GB free: a batch of 4096 rows of 32 tokens needs more; the message says the batch that fits
    req = SampleRequest(num=4096, batch_size=4096)
    with pytest.raises(ValueError, match=r"needs about .* GB .* but cpu has 1 GB free; use --batch-size (\d+) or less"):
        g.check_memory(run, req, 32, free=1e9)
    bs = int(
        str(pytest.raises(ValueError, g.check_memory, run, req, 32, free=1e9).value)
        .split("--batch-size ")[1]
        .split()[0]
    )
    g.check_memory(run, SampleRequest(num=4096, batch_size=bs), 32, free=1e9)  # the suggestion fits
    with pytest.raises(ValueError):
        g.check_memory(run, SampleRequest(num=4096, batch_size=bs + 1), 32, free=1e9)
    g.check_memory(run, SampleRequest(num=4, batch_size=4), 32, free=1e9)  # the ordinary request passes
    calls = []
    monkeypatch.setattr(g, "_sample", lambda *a, **k: calls.append(a))
    monkeypatch.setattr("replaid.training.memory.free_bytes", lambda dev: 1e6)
    with pytest.raises(ValueError, match="MB|GB free"):
        g.generate(run, SampleRequest(num=4, batch_size=4))
    assert calls == []  # refused before sampling began


def test_sweep_refuses_a_sampler_or_step_count_the_run_cannot_honour():
    from replaid.methods import get_method
    from replaid.sampling.sweep import quality_sweep

    cfg = resolve("debug", None, ["method=ar"])
    run = SimpleNamespace(method=get_method(cfg), cfg=cfg)
    L = cfg.data.seq_len
    kw = dict(temperatures=[], num=2, split="valid", seed=0)
    with pytest.raises(ValueError, match="sampler ddpm is not one of this ar run's"):
        quality_sweep(run, None, samplers=["ddpm"], steps=[2], temp_sampler="ddpm", temp_steps=2, **kw)
    with pytest.raises(ValueError, match=f"must be {L}"):
        quality_sweep(run, None, samplers=["ancestral"], steps=[2], temp_sampler="ancestral", temp_steps=L, **kw)


def test_a_refused_trainer_leaves_no_lock_files(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("x")
    assert main(["train", "--preset", "debug", "--out", str(folder), "--no-progress"]) == 2
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    assert main(["train", "--out", str(tmp_path / "none"), "--resume"]) == 2
    assert not (tmp_path / "none").exists()


def test_a_config_integer_is_exact_or_refused():
    from replaid.config import ConfigError

    assert resolve("debug", None, ["train.steps=1e3"]).train.steps == 1000
    assert resolve("debug", None, ["train.steps=123456789012345678"]).train.steps == 123456789012345678
    for bad in ("99999999999999999999999999", "12345678901234567.0", "1.5", "1e30", "ten"):  # 2nd: float rounds it
        with pytest.raises(ConfigError, match="train.steps"):
            resolve("debug", None, [f"train.steps={bad}"])


def test_eval_and_likelihood_refuse_what_cannot_fit_before_allocating(trained, tmp_path, monkeypatch, capsys):
    """With little memory free, ``replaid eval`` and ``replaid likelihood`` refuse in one line that
    names the estimate, the free memory and the largest --batch-size that fits, before the first batch
    (nothing evaluated, no --out); the suggested batch size then runs."""
    import replaid.eval.evaluate as ev
    import replaid.eval.likelihood as lk

    free = {"bytes": 6e6}  # the debug run's weights fit; an evaluation batch of the whole split does not
    monkeypatch.setattr("replaid.training.memory.free_bytes", lambda dev: free["bytes"])
    calls: list = []
    real_eval, real_lik = ev.evaluate_model, lk.estimate_likelihood
    monkeypatch.setattr(ev, "evaluate_model", lambda *a, **k: calls.append("eval") or real_eval(*a, **k))
    monkeypatch.setattr(lk, "estimate_likelihood", lambda *a, **k: calls.append("lik") or real_lik(*a, **k))

    def refused(argv) -> int:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("replaid: error: ") and "needs about" in err[0], err
        assert "cpu has 6 MB free; use --batch-size" in err[0], err
        return int(err[0].split("--batch-size ")[1].split()[0])

    bs = refused(["eval", str(trained), "--batch-size", "64"])
    assert calls == [] and bs >= 1
    assert main(["eval", str(trained), "--batch-size", str(bs), "--max-batches", "1"]) == 0 and calls == ["eval"]
    capsys.readouterr()
    out = tmp_path / "lk"
    argv = ["likelihood", str(trained), "--num-seqs", "8", "--K", "8", "--steps", "2", "--out", str(out)]
    bs = refused([*argv, "--batch-size", "64"])
    assert calls == ["eval"] and not out.exists() and bs >= 1
    assert main([*argv, "--batch-size", str(bs)]) == 0 and calls == ["eval", "lik"]


UNREACHABLE = "http://127.0.0.1:9"  # nothing listens on the discard port: connections are refused at once


@pytest.mark.parametrize("argv", [["eval", "someorg/somemodel"], ["data", "--source", "hf:wikitext"]])
def test_an_unreachable_hub_is_one_line_at_once(argv, monkeypatch, capsys):
    """A Hub model id or an ``hf:`` data source with the Hub unreachable: one line saying so and what to
    do (a local path, or HF_HUB_OFFLINE=1 with a cached copy), exit 2, in seconds: not the libraries'
    retries (5 with backoff, ~25 s, a line each)."""
    import time

    import huggingface_hub.constants as hc

    for v in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(hc, "ENDPOINT", UNREACHABLE)  # what HF_ENDPOINT sets at import
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    import datasets  # noqa: F401  the imports before the clock: the time is the Hub's
    from huggingface_hub import snapshot_download  # noqa: F401

    import replaid.commands.data
    import replaid.commands.eval
    import replaid.store.loading  # noqa: F401

    t0 = time.time()
    code = main(argv)
    seconds = time.time() - t0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and err[0].startswith("replaid: error: "), err
    assert f"the Hugging Face Hub ({UNREACHABLE}) could not be reached" in err[0] and "HF_HUB_OFFLINE=1" in err[0]
    assert seconds < 5, seconds


def test_hf_endpoint_unreachable_through_the_cli(tmp_path):
    """The same through HF_ENDPOINT in a fresh interpreter: one line, exit 2, no retry lines."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=UNREACHABLE, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    r = subprocess.run(
        [sys.executable, "-m", "replaid", "data", "--source", "hf:wikitext"], capture_output=True, text=True, env=env
    )
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(err) == 1 and "could not be reached" in err[0], r.stderr
