"""Completions (issue 39 §2): ``replaid sample --max-tokens/--stop`` on a block-diffusion run, written block
by block past its training length and streamed one chunk per committed block; the cutting rules of one
sample (end-of-text, stop strings held back until final, max_tokens); the one-line refusals."""

from __future__ import annotations

import io
import json
import sys

import pytest
import torch

from replaid.cli import main
from replaid.sampling.request import BLOCK_LENGTH_FACTOR, SampleRequest
from replaid.sampling.stream import Completion, SampleText
from replaid.store.loading import load_run

L, BLOCK = 16, 4


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A debug-size MDLM with blocks of 4 tokens, data.seq_len 16 (3 training steps: seconds)."""
    out = tmp_path_factory.mktemp("completions") / "bd3"
    sets = ["method=mdlm", f"mdlm.block_size={BLOCK}", f"data.seq_len={L}", "train.steps=3", "eval.max_batches=1"]
    assert main(["train", "--preset", "debug", "--out", str(out), "--no-progress", "train.num_threads=1", *sets]) == 0
    return out


@pytest.fixture(scope="module")
def run(run_dir):
    return load_run(run_dir)


def _request(**kw) -> SampleRequest:
    return SampleRequest(**{"num": 1, "steps": 4, "seed": 3, "progress": False, "ignore_eos": True, **kw})


def test_eight_times_the_context_block_by_block_one_delta_list_per_block(run):
    """8 x seq_len tokens with a 2-token prompt: one list of deltas per block that holds generated tokens,
    the ids those the block sampler writes with the cache's sliding window (seq_len - block rows), and
    the deltas adding up to the text of those ids."""
    from blockref import sample_blocks
    from replaid.sampling.continuous import time_grid

    prompt = "def"
    P = len(run.tokenizer.encode(prompt))
    n = 8 * L
    comp = Completion(run, _request(prompt=prompt, max_tokens=n))
    events = list(comp)
    n_blocks = -(-(P + n) // BLOCK) - P // BLOCK  # blocks with generated tokens
    assert len(events) == n_blocks and all(len(ev) == 1 for ev in events)
    assert [ev[0].finish_reason for ev in events] == [None] * (n_blocks - 1) + ["length"]
    ids = comp.samples[0].kept_ids()
    assert len(ids) == n
    x = torch.full((1, -(-(P + n) // BLOCK) * BLOCK), run.model.n_out)
    x[0, :P] = torch.tensor(run.tokenizer.encode(prompt))
    ref = sample_blocks(
        run.model, x, time_grid(4), generator=torch.Generator().manual_seed(3), block=BLOCK, window=L - BLOCK
    )
    assert ref.tokens[0, P : P + n].tolist() == ids
    assert "".join(ev[0].text for ev in events) == run.tokenizer.decode(ids)
    row = Completion(run, _request(prompt=prompt, max_tokens=n)).rows()[0]
    assert row["ids"][P:] == ids and row["text"] == prompt + row["completion"]  # the same seed, the same text


def test_past_the_training_length_the_cache_keeps_seq_len_less_one_block(run):
    """With weights that make attention matter (a 3-step run's blocks are near the identity), the
    completion's tokens are the block sampler's with a window of seq_len - block rows, not without one."""
    import copy
    import dataclasses

    from blockref import sample_blocks
    from replaid.sampling.continuous import time_grid

    model = copy.deepcopy(run.model)
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=0.3)
    loud = dataclasses.replace(run, model=model)
    n = 4 * L
    comp = Completion(loud, _request(max_tokens=n))
    list(comp)
    ids = comp.samples[0].kept_ids()
    x = torch.full((1, n), model.n_out)

    def ref(window):
        g = torch.Generator().manual_seed(3)
        return sample_blocks(model, x, time_grid(4), generator=g, block=BLOCK, window=window).tokens[0].tolist()

    assert ids == ref(L - BLOCK) and ids[:L] == ref(None)[:L] and ids != ref(None)


def _cli(run_dir, *args) -> tuple[int, list[str]]:
    """``replaid sample`` with stdout recorded as the chunks written between flushes."""

    class Chunks(io.StringIO):
        def __init__(self):
            super().__init__()
            self.chunks: list[str] = []
            self.mark = 0

        def flush(self):
            text = self.getvalue()
            if len(text) > self.mark:
                self.chunks.append(text[self.mark :])
                self.mark = len(text)

    out, old = Chunks(), sys.stdout
    sys.stdout = out
    try:
        # --raw: the text is compared with Completion's decoded text (the escapes: tests/test_issue54.py)
        code = main(["sample", str(run_dir), "--num", "1", "--steps", "4", "--seed", "3", "--raw", *args])
    finally:
        sys.stdout = old
    out.flush()
    return code, out.chunks


def test_the_cli_streams_one_chunk_per_block_and_cuts_at_the_stop(run, run_dir):
    n = 8 * L
    full = Completion(run, _request(max_tokens=n))
    events = list(full)
    text = full.samples[0].text
    code, chunks = _cli(run_dir, "--max-tokens", str(n), "--ignore-eos")
    assert code == 0
    body = "".join(chunks)
    assert body == text + "\n" + "-" * 40 + "\n"
    # one flushed chunk per committed block (each block's text as it is ready), the separator last
    assert chunks[:-1] == [ev[0].text for ev in events if ev[0].text] and len(chunks) - 1 >= n // BLOCK - 2
    # a stop string from the middle of that text: the output ends right before its first occurrence
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = text.find(stop)
    code, chunks = _cli(run_dir, "--max-tokens", str(n), "--ignore-eos", "--stop", "zzzq", "--stop", stop)
    assert code == 0 and "".join(chunks) == text[:cut] + "\n" + "-" * 40 + "\n"
    assert len(chunks) - 1 < len(events)  # generation ended at the block that wrote the stop


def test_json_rows_of_a_completion(run_dir, capsys):
    capsys.readouterr()
    assert main(["sample", str(run_dir), "--num", "3", "--steps", "4", "--max-tokens", "10", "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(rows) == 3
    for r in rows:
        assert r["finish_reason"] in ("stop", "length") and r["text"] == r["completion"]
        assert len(r["ids"]) <= 10 and (r["finish_reason"] == "stop" or len(r["ids"]) == 10)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--max-tokens", "0"], "argument --max-tokens"),
        (["--max-tokens", str(BLOCK_LENGTH_FACTOR * L + 1)], f"passes the limit of {BLOCK_LENGTH_FACTOR * L} tokens"),
        (["--max-tokens", "8", "--length", "16"], "--length and --max-tokens"),
        (["--stop", ""], "a stop string must not be empty"),
        (["--context", "a [MASK:4] b"], "--context"),
        # a prompt that fills all a request may hold: shorten it (was "ask for fewer" --max-tokens than 1)
        (["--prompt", "word " * BLOCK_LENGTH_FACTOR * L, "--max-tokens", "1"], "shorten the prompt to fewer than"),
        (["--prompt", "word " * BLOCK_LENGTH_FACTOR * L], "shorten the prompt to fewer than"),
        (["--prompt", "ab\udcff", "--max-tokens", "8"], "--prompt is not valid Unicode"),  # not UTF-8: a traceback
        (
            ["--length", str(BLOCK_LENGTH_FACTOR * L + 1)],
            f"--length {BLOCK_LENGTH_FACTOR * L + 1}: passes the limit",
        ),  # was: --max-tokens
        (["--max-tokens", "9" * 5000], "(5000 digits): too long"),  # int()'s limit: was "not a whole number"
        (["--steps", "-" + "9" * 5000], "(5000 digits): must be >= 1"),
    ],
)
def test_bad_completion_requests_get_one_line_and_status_2(run_dir, capsys, args, message):
    capsys.readouterr()
    try:
        code = main(["sample", str(run_dir), *args])
    except SystemExit as e:  # argparse's own check of the value
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("replaid: error:") and message in err[0], err


def test_a_run_without_blocks_writes_at_most_its_length_less_the_prompt(run):
    """The same rule for every one-pass run (served or sampled): P + max_tokens <= its length."""
    from replaid.config import ConfigError
    from replaid.methods import get_method
    from replaid.presets import resolve

    plain = get_method(resolve("debug", None, ["method=mdlm", f"data.seq_len={L}"]))
    tok = run.tokenizer
    P = len(tok.encode("def"))
    _request(prompt="def", max_tokens=L - P).check(plain, tok, L)
    with pytest.raises(ConfigError, match=f"no block-diffusion run.*ask for at most {L - P}"):
        _request(prompt="def", max_tokens=L - P + 1).check(plain, tok, L)
    long = "word " * L  # no max_tokens fits: the prompt must shrink (was "ask for at most -N")
    for mt in (1, None):
        with pytest.raises(ConfigError, match=f"the prompt is .*shorten the prompt to fewer than {L} tokens"):
            _request(prompt=long, max_tokens=mt, stop=("x",)).check(plain, tok, L)


class Chars:
    """A tokenizer of one id per character (end-of-text: id 0)."""

    eos_id = 0

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def _feed(sample: SampleText, *pieces: str) -> list[str]:
    return [sample.feed([ord(c) for c in p]) for p in pieces]


def test_a_stop_string_is_held_back_until_it_is_known_not_to_be_one():
    s = SampleText(Chars(), 100, ("abc",), eos=0)
    assert _feed(s, "xxab", "d", "yyab", "cz") == ["xx", "abd", "yy", ""]
    assert s.text == "xxabdyy" and s.finish_reason == "stop" and len(s.kept_ids()) == len("xxabdyy")
    s = SampleText(Chars(), 100, ("abc",), eos=0)
    assert _feed(s, "xxab") == ["xx"] and s.feed([0]) == "ab" and s.finish_reason == "stop"  # end-of-text
    assert s.feed([ord("q")]) == ""  # nothing after the end


def test_max_tokens_and_end_of_text_cut_the_ids():
    s = SampleText(Chars(), 5, (), eos=0)
    assert (
        _feed(s, "abc", "defg") == ["abc", "de"]
        and s.finish_reason == "length"
        and s.kept_ids() == [97, 98, 99, 100, 101]
    )
    s = SampleText(Chars(), 5, (), eos=None)  # --ignore-eos: id 0 is a token like any other
    assert s.feed([97, 0, 98]) == "a\x00b" and s.finish_reason is None


def test_a_continuous_block_run_writes_eight_times_its_context_and_stops_at_a_stop(tmp_path):
    """RePlaid with blocks (diffusion.block_size) through the same completion path: 8 x seq_len tokens,
    the ids those of the continuous block sampler with the request's seed, sampler and window; the CLI's
    output cut before a stop string taken from that text."""
    from blockref import sample_blocks_continuous
    from replaid.diffusion.rng import device_generator
    from replaid.sampling.continuous import gamma_grid
    from replaid.sampling.registry import get_sampler

    out = tmp_path / "replaid-blocks"
    sets = ["method=replaid", f"diffusion.block_size={BLOCK}", f"data.seq_len={L}", "train.steps=3"]
    argv = ["train", "--preset", "debug", "--out", str(out), "--no-progress", "train.num_threads=1"]
    assert main([*argv, *sets, "eval.max_batches=1"]) == 0
    import copy
    import dataclasses

    run = load_run(out)
    model = copy.deepcopy(run.model)  # weights that make attention matter (3 steps leave blocks near identity)
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=0.3)
    loud = dataclasses.replace(run, model=model)
    n = 8 * L
    comp = Completion(loud, _request(max_tokens=n))
    events = list(comp)
    ids = comp.samples[0].kept_ids()
    assert len(ids) == n and len(events) == n // BLOCK

    def ref(window):
        return (
            sample_blocks_continuous(
                model,
                get_sampler(run.method, None).fn,
                torch.zeros(1, n, dtype=torch.long),
                torch.zeros(1, n, dtype=torch.bool),
                gamma_grid(model.schedule, 4),
                generator=device_generator(torch.Generator().manual_seed(3), "cpu"),
                block=BLOCK,
                window=window,
                options={"self_cond": None, "disable_progress": True},
            )
            .tokens[0]
            .tolist()
        )

    assert ids == ref(L - BLOCK) and ids != ref(None)
    comp = Completion(run, _request(max_tokens=n))  # the trained weights, as the CLI loads them
    list(comp)
    text = comp.samples[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    code, chunks = _cli(out, "--max-tokens", str(n), "--ignore-eos", "--stop", stop)
    assert code == 0 and "".join(chunks) == text[: text.find(stop)] + "\n" + "-" * 40 + "\n"


def test_a_gpu_trained_run_is_sampled_on_a_cpu_machine_to_eight_times_the_context(run_dir, tmp_path, capsys):
    """A run whose config says train.device=cuda (trained on a lent GPU) loads on a machine without CUDA
    ('auto' falls back to the CPU), and ``replaid sample`` writes 8 x seq_len tokens block by block,
    stopped by a stop string: the first generated text's prefix, so the stop must fire."""
    import json
    import shutil

    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the CPU fallback")
    gpu_run = tmp_path / "gpu-trained"
    shutil.copytree(run_dir, gpu_run)
    from replaid.store import checkpoint as ck

    for f in [gpu_run / "config.json", *gpu_run.glob("checkpoints/*/state.json")]:  # the config is in both
        obj = json.loads(f.read_text())
        obj.get("config", obj)["train"]["device"] = "cuda"
        if "config" in obj:  # as the GPU run wrote it: its record signs the config it was trained with
            obj["sha256"][ck.CONFIG_DIGEST] = ck.config_digest(obj["config"])
        f.write_text(json.dumps(obj))
    assert load_run(gpu_run).model.embed.weight.device.type == "cpu"
    args = ["sample", str(gpu_run), "--max-tokens", str(8 * L), "--seed", "3", "--steps", "4", "--ignore-eos"]
    assert main([*args, "--json"]) == 0
    text = json.loads(capsys.readouterr().out.splitlines()[0])["text"]  # JSON lines: one per sample
    assert len(text) > 0
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert main([*args, "--json", "--stop", stop]) == 0
    cut_text = json.loads(capsys.readouterr().out.splitlines()[0])["text"]
    assert stop not in cut_text and text.startswith(cut_text) and len(cut_text) < len(text)
