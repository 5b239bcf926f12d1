"""replaid as an lm-evaluation-harness model (issue 25): windows, the conditional likelihoods against exact
answers, rolling = zeroshot, and the harness end to end on local tasks at debug size."""

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from replaid.cli import main
from replaid.config import RunConfig
from replaid.diffusion.oracle import OracleDenoiser, random_unit_embeddings
from replaid.eval.harness import Scorer, request_rows, rolling_rows, totals, windows
from replaid.methods.ar import ARMethod
from replaid.methods.mdlm import MDLMMethod
from replaid.methods.replaid import continuous_conditional_nll
from replaid.presets import get_preset

REPO = Path(__file__).resolve().parents[1]


def debug_cfg(method: str) -> RunConfig:
    cfg = get_preset("debug")
    cfg.method = method
    cfg.train.num_threads = 1
    return cfg


def fake_run(method, model, L: int):
    return SimpleNamespace(
        method=method, model=model, cfg=SimpleNamespace(eval=method.cfg.eval, data=SimpleNamespace(seq_len=L))
    )


def randomise(model, scale: float = 0.5, seed: int = 0) -> None:
    """Non-trivial outputs from an untrained network (its last layer starts at zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


# ---------------------------------------------------------------------------------------------- windows


@pytest.mark.parametrize("n,L,start,context", [(1, 4, 0, 0), (9, 4, 0, 0), (13, 5, 0, 2), (12, 4, 3, 0), (30, 6, 7, 3)])
def test_windows_score_every_token_once_in_rows_of_at_most_L(n, L, start, context):
    seen = []
    for a, b, k in windows(n, L, start, context):
        assert 0 <= a < b <= n and b - a <= L and 1 <= k <= b - a
        seen += range(b - k, b)  # the scored tail of the row
        if start > 0 and b - k == start:
            assert b - a > k, "a request's context keeps at least one position"
    assert seen == list(range(start, n)), "every token of [start, n) scored once, in order"


@pytest.mark.parametrize("n,L,context", [(3, 8, 0), (40, 8, 0), (41, 8, 3), (17, 6, 5)])
def test_rolling_windows_are_the_harness_windows(n, L, context):
    """Scored chunks = the harness's get_rolling_token_windows(max_seq_len=L, context_len=context + 1); each
    row's context = the harness's disjoint context without its first token (a row here is L tokens)."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    ids = list(range(100, 100 + n))
    theirs = [make_disjoint_window(w) for w in get_rolling_token_windows(ids, -1, L, context + 1)]
    ours = rolling_rows(ids, L, 0, context)
    assert len(ours) == len(theirs)
    for r, (ctx, cont) in zip(ours, theirs, strict=True):
        assert r.ids[len(r.ids) - r.n_scored :] == cont
        assert r.ids[: len(r.ids) - r.n_scored] == ctx[1:]


# ---------------------------------------------------------------------------------------------- AR exact


def test_ar_loglikelihood_is_the_exact_log_probability_and_is_greedy_matches_argmax():
    torch.manual_seed(0)
    m = ARMethod(debug_cfg("ar"))
    V, L = 40, 12
    model = m.build_model(V).eval()
    randomise(model)
    run = fake_run(m, model, L)
    ctx = [3, 17, 5, 9]
    # greedy continuation of the context, decoded directly
    ids = list(ctx)
    with torch.no_grad():
        for _ in range(4):
            x = torch.tensor([ids + [0]])
            logits = model(torch.cat([torch.full((1, 1), V), x[:, :-1]], 1))
            ids.append(int(logits[0, len(ids)].argmax()))
    greedy = ids[len(ctx) :]
    other = greedy[:2] + [(greedy[2] + 1) % V] + greedy[3:]
    long_ctx = list(range(1, 20)) + ctx  # longer than L: truncated from the left
    s = Scorer(run, mc=1, batch_size=2, progress=False)
    reqs = [(ctx, greedy), (ctx, other), (long_ctx, other)]
    rows = [r for i, (c, k) in enumerate(reqs) for r in request_rows(c, k, L, i)]
    s.score(rows, greedy=True)
    out = totals(rows, len(reqs))

    def direct(c, k):  # log p(k | c) = sum of the next-token log-softmax, [BOS] + at most L - 1 tokens
        seq = (c + k)[-L:]
        x = torch.tensor([seq])
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.cat([torch.full((1, 1), V), x[:, :-1]], 1)).double(), -1)[0]
        return sum(float(lp[i, seq[i]]) for i in range(len(seq) - len(k), len(seq)))

    for (c, k), (ll, _g) in zip(reqs, out, strict=True):
        assert ll == pytest.approx(direct(c, k), abs=1e-4)
    assert [g for _, g in out] == [True, False, False]


# ---------------------------------------------------------------------------------------------- MDLM by enumeration


def test_mdlm_conditional_bound_is_below_the_exact_conditional_loglik_by_enumeration():
    """Toy V = 3, L = 4, context = 2 tokens, continuation = 2: with a time-independent network the
    continuous-time reverse process unmasks one position at a time in a uniform random order, so
    ``p(c | x) = E_order prod p(c_i | ...)`` (enumerated) and the NELBO equals ``E_order[-sum log p]``
    (enumerated); the Monte Carlo bound must match the latter and lie above ``-log p(c | x)``."""
    m = MDLMMethod(debug_cfg("mdlm"))
    m.cfg.eval.t_samples = 8
    V = 3
    model = m.build_model(V).eval()
    randomise(model, 0.2)
    x = torch.tensor([[0, 2, 1, 2]])
    target = torch.tensor([[False, False, True, True]])
    T = [2, 3]

    def logp(z, pos):
        with torch.no_grad():
            return float(torch.log_softmax(model(z, None).double(), -1)[0, pos, x[0, pos]])

    ao = []
    for order in itertools.permutations(T):
        z = x.clone()
        z[0, T] = V  # continuation masked
        lp = 0.0
        for pos in order:
            lp += logp(z, pos)
            z[0, pos] = x[0, pos]
        ao.append(-lp)
    ao_nelbo = sum(ao) / len(ao)
    exact_nll = -(torch.logsumexp(-torch.tensor(ao, dtype=torch.float64), 0).item() - math.log(len(ao)))
    assert ao_nelbo > exact_nll + 1e-4, "the toy must have a Jensen gap to test"
    gen = torch.Generator().manual_seed(0)
    est = torch.cat([m.conditional_nll(model, x.repeat(512, 1), target.repeat(512, 1), gen) for _ in range(2)])
    se = float(est.std()) / math.sqrt(est.numel())
    assert abs(float(est.mean()) - ao_nelbo) < 4 * se + 2e-3 * ao_nelbo, (float(est.mean()), ao_nelbo, se)
    assert float(est.mean()) + 4 * se >= exact_nll


# ---------------------------------------------------------------------------------------------- continuous: oracle


def test_continuous_conditional_bound_is_above_the_oracle_conditional_nll_and_tight():
    """i.i.d. tokens: the exact conditional NLL is ``-sum_{continuation} log p(x_l)``; the bound (the
    continuation's share of the NELBO) lies above it by no more than the schedule's discretisation gap."""
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    o = OracleDenoiser(p, random_unit_embeddings(5, 4, seed=3))
    g0, g1 = -10.0, 10.0
    o.schedule = lambda t: (g0 + (g1 - g0) * t.double(), torch.full_like(t.double(), g1 - g0))
    cfg = debug_cfg("replaid")
    cfg.eval.t_samples = 16
    gen = torch.Generator().manual_seed(0)
    x = o.sample_tokens((512, 10), gen)
    target = torch.arange(10).view(1, -1).expand(512, -1) >= 6  # 4 scored tokens, 6 of context
    est = continuous_conditional_nll(cfg, o, x, target, gen)
    exact = -(p.double().log()[x] * target.double()).sum(1)
    gap = est - exact
    se = float(gap.std()) / math.sqrt(gap.numel())
    assert float(gap.mean()) > -3 * se, "an upper bound on the conditional NLL"
    assert float(gap.mean()) < 0.02 * 4, "tight for the oracle (<= 0.02 nats per scored token)"


# ---------------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("lmeval-runs")
    out = {}
    for m in ("ar", "mdlm", "duo", "replaid"):
        args = ["train", "--preset", "debug", "--method", m, "--out", str(d / m), "--no-progress"]
        assert main(args + ["train.steps=2", "train.num_threads=1", "data.seq_len=32"]) == 0
        out[m] = d / m
    return out


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ar", "mdlm", "replaid"])
def test_rolling_equals_zeroshot_on_the_same_rows(runs, method, tmp_path):
    """The token stream of zeroshot's rows, scored by loglikelihood_rolling's windows: the same rows, the
    same computation and draws (seed, batch size), so the same nats (AR exact; the bounds at one seed)."""
    from replaid.data.zeroshot import bos_eos, load_documents, wrap_documents
    from replaid.eval.zeroshot import zeroshot_run
    from replaid.store.loading import load_run

    (tmp_path / "wikitext2").mkdir()
    (tmp_path / "wikitext2" / "valid.txt").write_text(" = Title = \n \n Return the value of the key . \n" * 30)
    run = load_run(runs[method])
    res = zeroshot_run(run, ["wikitext2"], str(tmp_path), batch_size=4, t_samples=3, progress=False)["wikitext2"]
    docs, _ = load_documents("wikitext2", None, str(tmp_path))
    L = run.cfg.data.seq_len
    rows = wrap_documents(run.tokenizer.encode_batch(docs), L, *bos_eos(run.tokenizer))
    s = Scorer(load_run(runs[method]), mc=3, batch_size=4, seed=0, progress=False)
    rr = rolling_rows(rows.reshape(-1).tolist(), L, 0)
    assert len(rr) == len(rows) and all(r.n_scored == L for r in rr)
    s.score(rr)
    nats = -totals(rr, 1)[0][0]
    assert nats / rows.size == pytest.approx(res["nats_per_token"], rel=1e-9)
    # another seed: a different draw of the bound, within its Monte Carlo error
    if method != "ar":
        s2 = Scorer(load_run(runs[method]), mc=3, batch_size=4, seed=1, progress=False)
        rr2 = rolling_rows(rows.reshape(-1).tolist(), L, 0)
        s2.score(rr2)
        per_row = torch.tensor([r.nats / L for r in rr2])
        se = float(per_row.std()) / math.sqrt(len(rr2))
        assert abs(float(per_row.mean()) - res["nats_per_token"]) < 4 * se + 1e-9


def _tasks(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "zeroshot" / "wikitext2").mkdir(parents=True)
    (data / "zeroshot" / "wikitext2" / "valid.txt").write_text(
        " = Alpha = \n \n Return the value of the key . It is in the list . \n \n"
        " = Beta = \n \n The list holds the keys of the table , sorted by value . \n"
    )
    (data / "held").mkdir()
    text = "Return the value of the key in the list and the table. " * 12
    (data / "held" / "test.jsonl").write_text("\n".join(json.dumps({"text": text}) for _ in range(3)) + "\n")
    out = tmp_path / "tasks"
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_lmeval_tasks.py"), "--data", str(data), "--held-out", "held",
         "--out", str(out), "--n", "4"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out


TASKS = ["replaid_wikitext2", "replaid_lambada", "replaid_cloze", "replaid_lambada_gen"]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ar", "mdlm", "duo", "replaid"])
def test_replaid_lmeval_runs_the_local_tasks_end_to_end(runs, method, tmp_path, capsys):
    tasks = _tasks(tmp_path)
    args = ["lmeval", str(runs[method]), "--tasks", *TASKS, "--include-path", str(tasks), "--limit", "2"]
    assert main(args + ["--mc-samples", "2", "--gen-steps", "4", "--out", str(tmp_path / "out")]) == 0
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    r = res["results"]
    assert set(TASKS) <= set(r)
    wt = r["replaid_wikitext2"]
    assert math.isfinite(wt["word_perplexity,none"]) and wt["word_perplexity,none"] > 1
    assert math.isfinite(r["replaid_lambada"]["perplexity,none"])
    assert 0 <= r["replaid_cloze"]["acc,none"] <= 1
    assert "exact_match,first_word" in r["replaid_lambada_gen"]
    d = res["replaid"]
    assert d["method"] == method and d["requests"]["loglikelihood_rolling"] > 0
    assert d["loglikelihood"].startswith("exact" if method == "ar" else "lower bound")
    # a second run into the same folder is refused in one line
    capsys.readouterr()  # drop the first run's output (the harness's progress bars)
    assert main(args + ["--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().startswith("replaid: error: --out")


@pytest.mark.slow
def test_the_harness_cli_knows_model_replaid(runs, tmp_path):
    """``lm_eval --model replaid --model_args run=...`` (the .pth hook written by scripts/setup.sh)."""
    tasks = _tasks(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "lm_eval", "run", "--model", "replaid", "--model_args",
         f"run={runs['mdlm']},mc_samples=2,progress=False", "--tasks", "replaid_lambada",
         "--include_path", str(tasks), "--limit", "2", "--output_path", str(tmp_path / "h")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "replaid_lambada" in r.stdout


def test_bad_inputs_are_one_line_errors(runs, tmp_path, capsys):
    tasks = str(_tasks(tmp_path))
    ar = str(runs["ar"])
    cases = [
        (["lmeval", ar, "--tasks", "no_such_task", "--include-path", tasks], "unknown task(s) no_such_task"),
        (["lmeval", ar, "--tasks", "x", "--include-path", str(tmp_path / "none")], "--include-path"),
        (["lmeval", str(tmp_path / "missing"), "--tasks", "replaid_lambada", "--include-path", tasks], "missing"),
        (
            ["lmeval", ar, "--tasks", "replaid_lambada", "--include-path", tasks, "--likelihood", "ode"],
            "likelihood=ode",
        ),
        (["lmeval", ar, "--tasks", "replaid_lambada", "--include-path", tasks, "--mc-samples", "0"], "--mc-samples"),
    ]
    for argv, what in cases:
        try:
            code = main(argv)
        except SystemExit as e:  # refused by the option's argparse type (--mc-samples: a whole number >= 1)
            code = e.code
        assert code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("replaid: error:") and what in err and "\n" not in err, err


def test_local_tasks_score_the_word_after_a_space(tmp_path):
    """The continuation of every scored request starts with the space before the word (lambada: the target
    carries it, the harness adds none to a loglikelihood task; cloze: the harness's target_delimiter), so the
    word is tokenised as it occurs in text, not glued to the context's last word."""
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(_tasks(tmp_path)))
    for name in ("replaid_lambada", "replaid_cloze"):
        task = tm.load_task_or_group([name])[name]
        task.build_all_requests(limit=2, rank=0, world_size=1)
        conts = [inst.arguments[1] for inst in task.instances]
        assert conts and all(c.startswith(" ") and not c.startswith("  ") for c in conts), (name, conts)
        assert all(not inst.arguments[0].endswith(" ") for inst in task.instances)


# ---------------------------------------------------------------------------------------------- generate_until


def known_lm(run_dir: Path, word: str = " the", margin: float = 1.0):
    """A ReplaidLM whose network outputs the same logits everywhere: ``margin`` on the token of ``word``,
    0 elsewhere (final layer zeroed, its bias set). Greedy decoding then writes that token at every
    position; a draw at temperature 1 picks it with probability e^m / (e^m + V - 1), here under 0.01."""
    from replaid.hub.lmeval import ReplaidLM

    lm = ReplaidLM(run=str(run_dir), seed=0, gen_steps=4, progress=False)
    (k,) = lm.tok.encode(word)
    head = lm.run.model.final.linear
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[k] = margin
    return lm, k


def gen(lm, context: str, **kw) -> str:
    return lm.generate_until([SimpleNamespace(args=(context, kw))], disable_tqdm=True)[0]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ar", "mdlm"])
def test_generate_until_honours_do_sample_temperature_until_and_max_gen_toks(runs, method):
    """Issue 33: ``temperature: 0`` / ``do_sample: False`` were turned into sampling at 1.0. On a network
    with known logits: greedy requests write the argmax token exactly, sampled ones (do_sample, or a
    temperature > 0) do not; ``max_gen_toks`` is the number of tokens; ``until`` cuts as the harness cuts."""
    lm, k = known_lm(runs[method])
    assert lm.generation_settings({"do_sample": False})["temperature"] == 0
    greedy = lm.tok.decode([k] * 5)
    assert gen(lm, "Return the", until=["\n"], max_gen_toks=5, do_sample=False) == greedy
    assert gen(lm, "Return the", max_gen_toks=5, temperature=0) == greedy  # do_sample unset, temperature 0
    assert gen(lm, "Return the", max_gen_toks=5) == greedy  # the harness's default is greedy
    assert gen(lm, "", max_gen_toks=1, do_sample=False) == lm.tok.decode([k])  # no context, one token
    assert gen(lm, "Return the", max_gen_toks=3, do_sample=False) == lm.tok.decode([k] * 3)
    sampled = [
        gen(lm, "Return the", max_gen_toks=5, do_sample=True),
        gen(lm, "Return", max_gen_toks=5, temperature=1.0),
    ]
    assert all(s != greedy for s in sampled), sampled
    # until: the text before the first stop string ("he" of " the the ..." -> " t")
    assert gen(lm, "Return the", max_gen_toks=5, do_sample=False, until=["he", "\n"]) == greedy.split("he")[0]
    assert gen(lm, "Return the", max_gen_toks=5, do_sample=False, until="e t") == greedy.split("e t")[0]
    with pytest.raises(ValueError, match="top_k"):
        gen(lm, "Return the", max_gen_toks=2, top_k=5)


@pytest.mark.slow
def test_generate_until_stops_at_eos(runs):
    lm, k = known_lm(runs["ar"])
    eos = lm.tok.eos_id
    with torch.no_grad():
        lm.run.model.final.linear.bias.zero_()
        lm.run.model.final.linear.bias[eos] = 5.0
    assert gen(lm, "Return the", max_gen_toks=4, do_sample=False) == ""
