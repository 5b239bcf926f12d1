"""IsoFLOP study: the planner's FLOP accounting against independent counters, the fits against
synthetic studies drawn from known laws, and plan -> run -> fit end to end at debug size."""

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from replaid.scaling import fit as sf
from replaid.scaling import plan as sc
from replaid.scaling import report, runner
from replaid.training.flops import train_flops_per_token

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ FLOPs per token


def _sdpa_math(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
    """Attention as explicit matmuls, so FLOP counters see QK^T and AV (the full L x L product)."""
    s = (q @ k.transpose(-2, -1)) * (scale or q.shape[-1] ** -0.5)
    if is_causal:
        L = q.shape[-2]
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _forward_args(method, L):
    if method == "replaid":
        return (torch.randn(1, L, 16), torch.zeros(1, dtype=torch.float64), None)
    return (torch.zeros(1, L, dtype=torch.long),)


def _counted_forward_per_token(cfg, monkeypatch) -> float:
    """torch's FlopCounterMode on a fake-tensor model (no memory, no arithmetic) at the planned L."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from replaid.methods import get_method

    monkeypatch.setattr(F, "scaled_dot_product_attention", _sdpa_math)
    L = cfg.data.seq_len
    with FakeTensorMode():
        model = get_method(cfg).build_model(sc.planned_vocab_size(cfg))
        with FlopCounterMode(display=False) as fc:
            model(*_forward_args(cfg.method, L))
    per_seq = sum(
        sum(v.values())
        for k, v in fc.get_flop_counts().items()
        if k.split(".")[-1] in ("cond", "in_t", "adaLN") or ".adaLN" in k
    )
    return (fc.get_total_flops() - per_seq) / L


@pytest.mark.slow
def test_planner_flops_per_token_match_torch_flop_counter_for_every_paper_size(monkeypatch, capsys):
    """Every size of the paper's IsoFLOP table (L = 2048, V = 32,000 Llama-2 + specials): the
    planner's training FLOPs/token / 3 (without self-conditioning) equal FlopCounterMode's forward
    count, attention included (SDPA written as matmuls); per-sequence AdaLN/time MLPs are excluded
    from both. AR on every size, RePlaid on every third and the largest, MDLM (the AR network,
    bidirectional) on the smallest and largest."""
    ratios = []
    for i, (label, (h, n, a)) in enumerate(sc.PAPER_SIZES.items()):
        for method in ("ar",) + (("replaid",) if i % 3 == 0 or i == 27 else ()) + (("mdlm",) if i in (0, 27) else ()):
            cfg = sc.paper_protocol(h, n, a)
            cfg.method = method
            cfg.model.self_conditioning = False
            ours = train_flops_per_token(cfg, sc.planned_vocab_size(cfg)) / 3
            counted = _counted_forward_per_token(cfg, monkeypatch)
            # the discrete models' head has V + 0 outputs and V + 1 inputs: count exactly what is built
            ratios.append((label, method, counted / ours))
            assert counted / ours == pytest.approx(1.0, abs=2e-3), (label, method, counted, ours)
    with capsys.disabled():
        worst = max(ratios, key=lambda r: abs(r[2] - 1))
        print(
            f"\nFlopCounterMode / planner FLOPs per token over {len(ratios)} (size, method): "
            f"min {min(r[2] for r in ratios):.5f}, max {max(r[2] for r in ratios):.5f} (worst {worst})"
        )


def test_self_conditioning_costs_8_3_percent_more_flops_so_fewer_steps():
    plan = sc.make_plan(["replaid", "replaid-nosc"], [1e19], "116M", per_budget=0)
    sc_, nosc = plan.entries
    assert sc_.flops_per_token / nosc.flops_per_token == pytest.approx(1 + 0.25 / 3)
    assert sc_.steps / nosc.steps == pytest.approx(1 / (1 + 0.25 / 3), rel=1e-3)
    for e in plan.entries:  # steps spend the budget
        assert e.flops == pytest.approx(1e19, rel=1e-3)
        assert e.tokens == e.steps * 256 * 2048


def test_calflops_matches_the_planner_without_attention():
    """calflops (the paper's counter) on the two smallest paper sizes, real tensors at L = 64: it
    sees the linear layers and the head but not SDPA, so it equals the planner minus 4 n L d, up to
    the elementwise ops (LayerNorm, GELU, ...) it also counts (< 1%)."""
    calflops = pytest.importorskip("calflops")
    for h, n, a in list(sc.PAPER_SIZES.values())[:2]:
        cfg = sc.paper_protocol(h, n, a)
        cfg.method, cfg.data.seq_len = "ar", 64
        from replaid.methods import get_method

        model = get_method(cfg).build_model(sc.planned_vocab_size(cfg))
        fl, _, _ = calflops.calculate_flops(
            model=model, args=[torch.zeros(1, 64, dtype=torch.long)], print_results=False, output_as_string=False
        )
        ours = train_flops_per_token(cfg, sc.planned_vocab_size(cfg)) / 3 - 4 * n * 64 * h
        assert fl / 64 / ours == pytest.approx(1.0, abs=0.01), (h, fl / 64, ours)


def test_plan_selects_sizes_around_the_predicted_optimum_and_writes_an_editable_manifest(tmp_path):
    plan = sc.make_plan(["ar", "mdlm"], [6e18, 1e20], "paper", per_budget=5)
    for b in (6e18, 1e20):
        ns = sorted(e.params for e in plan.entries if e.budget == b and e.method == "ar")
        assert len(ns) == 5 and ns[0] < sc.predicted_optimum(b) < ns[-1]
    sc.write_plan(plan, tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "manifest.csv")))
    assert len(rows) == len(plan.entries) == len(sc.read_manifest(tmp_path))
    cfg = json.loads((tmp_path / rows[0]["config"]).read_text())
    assert cfg["train"]["steps"] == int(rows[0]["steps"]) and cfg["data"]["seq_len"] == 2048
    with pytest.raises(Exception, match="exists"):
        sc.write_plan(plan, tmp_path)


def test_per_method_centres_and_the_token_cap_choose_each_methods_window():
    """MDLM centred at 200 tokens/parameter takes smaller sizes than AR at 40; a token cap (the corpus'
    size) drops exactly the sizes that would repeat data and keeps k sizes per budget."""
    budgets = [3e11, 1e13]
    plan = sc.make_plan(["ar", "mdlm"], budgets, "tiny", per_budget=4, tokens_per_param={"*": 40, "mdlm": 200})
    for b in budgets:
        for m, tpp in (("ar", 40), ("mdlm", 200)):
            ns = sorted(e.params for e in plan.entries if e.budget == b and e.method == m)
            centre = sc.predicted_optimum(b, tpp)
            assert len(ns) == 4 and ns[0] <= centre <= ns[-1], (m, b, ns, centre)
    ar3 = {e.size for e in plan.entries if e.method == "ar" and e.budget == 3e11}
    md3 = {e.size for e in plan.entries if e.method == "mdlm" and e.budget == 3e11}
    assert min(sc.TINY_SIZES[s][0] for s in md3) < min(sc.TINY_SIZES[s][0] for s in ar3)

    free = sc.make_plan(["mdlm"], [1e13], "tiny", per_budget=4, tokens_per_param={"mdlm": 200})
    cap = 1.0e7
    assert any(e.tokens > cap for e in free.entries)  # uncapped, the small sizes read more than the cap
    capped = sc.make_plan(["mdlm"], [1e13], "tiny", per_budget=4, tokens_per_param={"mdlm": 200}, max_tokens=cap)
    assert len(capped.entries) == 4 and all(e.tokens <= cap for e in capped.entries)
    smallest_fitting = min(
        (e for e in sc.make_plan(["mdlm"], [1e13], "tiny", per_budget=0).entries if e.tokens <= cap),
        key=lambda e: e.params,
    )
    assert min(e.params for e in capped.entries) == smallest_fitting.params
    with pytest.raises(Exception, match="max-tokens"):
        sc.make_plan(["ar"], [1e15], "tiny", per_budget=4, max_tokens=1e3)
    with pytest.raises(Exception, match="tokens-per-param"):
        sc.make_plan(["ar"], [1e12], "tiny", per_budget=4, tokens_per_param={"duo": 10})


def test_plan_cli_takes_per_method_tokens_per_param_and_rejects_a_bad_one(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "replaid",
        "scaling",
        "plan",
        "--methods",
        "ar",
        "mdlm",
        "--sizes",
        "tiny",
        "--budgets",
        "3e11",
        "--json",
    ]
    p = subprocess.run(cmd + ["--tokens-per-param", "40", "mdlm=200"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    runs = json.loads(p.stdout)["runs"]
    n = {m: sorted(r["params"] for r in runs if r["method"] == m) for m in ("ar", "mdlm")}
    assert n["mdlm"][0] < n["ar"][0]
    p = subprocess.run(cmd + ["--tokens-per-param", "mdlm=lots"], capture_output=True, text=True, cwd=ROOT)
    assert (
        p.returncode == 2 and p.stderr.strip().startswith("replaid: error:") and len(p.stderr.strip().splitlines()) == 1
    )


# ------------------------------------------------------------------ fits on synthetic studies


def _synthetic(methods: dict, budgets, sizes_per_budget=7, spread=1.2, noise=0.002, seed=0, curv=0.08):
    """Rows from ``log L = curv (log N - log N*_C)^2 + log L*_C`` with ``L*_C = e^beta C^alpha`` and
    ``N*_C = e^beta' C^alpha'`` (per method), plus Gaussian noise on log L."""
    rng = np.random.default_rng(seed)
    rows = []
    for m, (al, be, alp, bep) in methods.items():
        for c in budgets:
            lnopt = alp * math.log(c) + bep
            for x in np.linspace(lnopt - spread, lnopt + spread, sizes_per_budget) + rng.uniform(-0.1, 0.1):
                ll = curv * (x - lnopt) ** 2 + al * math.log(c) + be + noise * rng.standard_normal()
                rows.append(
                    {
                        "method": m,
                        "flops": c * (1 + 0.01 * rng.uniform(-1, 1)),
                        "params": math.exp(x),
                        "loss": math.exp(ll),
                        "tokens": c / (6 * math.exp(x)),
                    }
                )
    return rows


BUDGETS = [6e18, 1e19, 3e19, 6e19, 1e20]


def test_fits_recover_exponents_optima_and_compute_multipliers():
    al, be, alp, bep = -0.048, 3.2, 0.52, -2.0
    k_true = 14.0
    laws = {
        "ar": (al, be, alp, bep),
        # same slope: L*_m(k C) = L*_ar(C) for k = 14 exactly; 1.8x fewer parameters at equal C
        "mdlm": (al, be - al * math.log(k_true), alp, bep - math.log(1.8)),
        # a steeper law: k(C) varies over the budget range, known in closed form
        "replaid": (-0.055, be - (-0.055) * math.log(20.0) + 0.007 * math.log(1e19), 0.5, bep),
    }
    res = sf.fit_points(_synthetic(laws, BUDGETS), reference="ar", n_boot=200, seed=1)
    for m, (a_, b_, ap, bp) in laws.items():
        mo = res["methods"][m]
        assert mo["alpha"] == pytest.approx(a_, abs=0.004)
        assert mo["alpha_prime"] == pytest.approx(ap, abs=0.03)
        assert mo["alpha_ci"][0] <= a_ <= mo["alpha_ci"][1] or abs(mo["alpha"] - a_) < 0.002
        for q in mo["budgets"]:
            assert q["bracketed"]
            assert q["n_opt"] == pytest.approx(math.exp(ap * math.log(q["budget"]) + bp), rel=0.08)
            assert q["loss_opt"] == pytest.approx(math.exp(a_ * math.log(q["budget"]) + b_), rel=0.005)
    md = res["methods"]["mdlm"]
    assert md["compute_multiplier"] == pytest.approx(k_true, rel=0.15)
    assert md["compute_multiplier_ci"][0] < k_true < md["compute_multiplier_ci"][1]
    assert md["param_ratio"] == pytest.approx(1 / 1.8, rel=0.1)
    # closed form for the steeper law, median over the fitted log-C range
    logc = np.linspace(math.log(6e18), math.log(1e20), 25)
    (am, bm), (ar_, br) = laws["replaid"][:2], laws["ar"][:2]
    k = np.exp(((ar_ - am) * logc + br - bm) / am)  # alpha_m log(k C) + beta_m = alpha_r log C + beta_r
    rp = res["methods"]["replaid"]
    assert rp["compute_multiplier"] == pytest.approx(float(np.median(k)), rel=0.2)
    assert rp["compute_multiplier_range"][0] < rp["compute_multiplier_range"][1]
    assert res["methods"]["ar"]["compute_multiplier"] == pytest.approx(1.0)
    assert not res["warnings"]


def test_multiplier_curve_closed_form():
    """k(C) solves L*_m(k C) = L*_r(C) for the two power laws."""
    lm, lr = (-0.05, 3.4), (-0.045, 3.2)
    for c in (1e18, 1e20):
        k = float(sf.multiplier_curve(lm, lr, np.array([math.log(c)]))[0])
        assert lm[0] * math.log(k * c) + lm[1] == pytest.approx(lr[0] * math.log(c) + lr[1], abs=1e-12)


def test_unbracketed_minimum_warns():
    laws = {"ar": (-0.05, 3.2, 0.5, -2.0)}
    rows = _synthetic(laws, BUDGETS[:3], spread=1.0)
    cut = [r for r in rows if not (r["flops"] < 8e18 and math.log(r["params"]) > 0.5 * math.log(6e18) - 2.0 - 0.2)]
    res = sf.fit_points(cut, reference="ar", n_boot=20)
    assert any("not bracketed" in w and "C=6e+18" in w and "larger" in w for w in res["warnings"])
    assert not res["methods"]["ar"]["budgets"][0]["bracketed"]
    # the laws ignore the unbracketed budget: the same as fitting without its runs at all
    rest = sf.fit_points([r for r in cut if r["flops"] >= 8e18], reference="ar", n_boot=20)
    for k in ("alpha", "beta", "alpha_prime", "beta_prime"):
        assert res["methods"]["ar"][k] == pytest.approx(rest["methods"]["ar"][k], rel=1e-9), k


def test_a_budget_still_at_the_unigram_level_is_left_out_of_the_laws():
    """A method that has learned nothing yet at the smallest budget (every size within noise of the
    unigram loss, its quadratic's minimum bracketed by chance) must not pull its laws."""
    laws = {"ar": (-0.05, 3.2, 0.5, -2.0)}
    rows = _synthetic(laws, BUDGETS[1:4], noise=0.001)
    uni = max(r["loss"] for r in rows) * 1.05
    rng = np.random.default_rng(1)
    flat = [
        {
            "method": "ar",
            "flops": 6e18,
            "params": float(n),
            "loss": uni + 0.002 * rng.standard_normal() + 0.01 * (math.log(n) - 20.5) ** 2,
            "tokens": 6e18 / (6 * n),
            "stderr": 0.01,
        }
        for n in np.exp(np.linspace(19.5, 21.5, 7))
    ]
    for r in rows:
        r.update(unigram=uni, stderr=0.01)
    for r in flat:
        r["unigram"] = uni
    res = sf.fit_points(rows + flat, reference="ar", n_boot=20)
    b0 = res["methods"]["ar"]["budgets"][0]
    assert b0["budget"] == 6e18 and b0["bracketed"] and b0["at_unigram_level"]
    assert any("C=6e+18" in w and "unigram" in w for w in res["warnings"])
    rest = sf.fit_points(rows, reference="ar", n_boot=20)
    for k in ("alpha", "beta", "alpha_prime", "beta_prime"):
        assert res["methods"]["ar"][k] == pytest.approx(rest["methods"]["ar"][k], rel=1e-9), k
    assert res["methods"]["ar"]["alpha"] == pytest.approx(-0.05, abs=0.01)
    assert not any(b["at_unigram_level"] for b in res["methods"]["ar"]["budgets"][1:])


def test_parametric_fit_recovers_a_chinchilla_law():
    E, A, a, B, b = 1.69, 406.4, 0.34, 410.7, 0.28  # Hoffmann et al.'s fitted law
    rng = np.random.default_rng(0)
    n = np.exp(rng.uniform(math.log(3e7), math.log(2e9), 60))
    d = np.exp(rng.uniform(math.log(5e8), math.log(5e10), 60))
    loss = (E + A / n**a + B / d**b) * np.exp(0.003 * rng.standard_normal(60))
    p = sf.fit_parametric(n, d, loss)
    assert p["E"] == pytest.approx(E, rel=0.1)
    assert p["a"] == pytest.approx(a, rel=0.2) and p["b"] == pytest.approx(b, rel=0.2)
    grid_n, grid_d = np.meshgrid(np.geomspace(3e7, 2e9, 5), np.geomspace(5e8, 5e10, 5))
    true = E + A / grid_n**a + B / grid_d**b
    assert np.allclose(sf.parametric_loss(p, grid_n, grid_d), true, rtol=0.01)


def test_crossover_matches_a_brute_force_search():
    """Two known L(N, D): the root in C of equal loss at fixed N, against a dense grid search, and
    the multiples of each method's compute-optimal compute."""
    pa = {"E": 1.5, "A": 150.0, "a": 0.33, "B": 900.0, "b": 0.30}  # worse early, better over-trained
    pb = {"E": 1.6, "A": 300.0, "a": 0.33, "B": 420.0, "b": 0.30}
    law_a, law_b = (0.5, -2.3), (0.5, -1.7)
    n_grid = np.array([5e7, 2e8])
    line = sf.crossover(pa, pb, 6.0, 6.0, law_a, law_b, n_grid)
    for e, n in zip(line, n_grid, strict=True):
        cs = np.geomspace(1e15, 1e26, 200001)
        gap = np.abs(np.log(sf.parametric_loss(pa, n, cs / (6 * n))) - np.log(sf.parametric_loss(pb, n, cs / (6 * n))))
        brute = cs[np.argmin(gap)]
        assert e["flops"] == pytest.approx(brute, rel=1e-3)
        assert e["mult_a"] == pytest.approx(brute / math.exp((math.log(n) - law_a[1]) / law_a[0]), rel=1e-3)
        assert e["mult_b"] / e["mult_a"] == pytest.approx(math.exp((law_b[1] - law_a[1]) / 0.5), rel=1e-6)


def test_fit_cli_on_a_csv_writes_json_report_and_plots(tmp_path):
    laws = {
        "ar": (-0.048, 3.2, 0.52, -2.0),
        "mdlm": (-0.048, 3.2 + 0.048 * math.log(14), 0.52, -2.6),
        "replaid": (-0.05, 3.35, 0.5, -2.9),
    }
    rows = _synthetic(laws, BUDGETS, sizes_per_budget=6)
    csv_path = tmp_path / "study.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["method", "flops", "params", "loss", "tokens"])
        w.writeheader()
        w.writerows(rows)
    out = tmp_path / "fit"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "replaid",
            "scaling",
            "fit",
            str(csv_path),
            "--out",
            str(out),
            "--json",
            "--bootstrap",
            "30",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    for m in laws:
        mo = res["methods"][m]
        for k in ("compute_multiplier", "param_ratio", "alpha", "beta", "alpha_prime", "beta_prime"):
            assert mo[k] is not None, (m, k)
        assert {"budget", "n_opt", "loss_opt"} <= set(mo["budgets"][0])
    assert res["methods"]["mdlm"]["compute_multiplier"] == pytest.approx(14, rel=0.2)
    for name in ("fit.json", "report.md", "isoflop.png", "likelihood_law.png", "param_law.png"):
        assert (out / name).is_file(), name
    bad = tmp_path / "bad.csv"
    bad.write_text("method,flops\nar,1e18\n")
    p = subprocess.run(
        [sys.executable, "-m", "replaid", "scaling", "fit", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert p.returncode == 2 and p.stderr.startswith("replaid: error:") and "method,flops,params,loss" in p.stderr


def test_several_sources_fit_as_one_study_and_a_shared_run_counts_once(tmp_path):
    laws = {"ar": (-0.048, 3.2, 0.52, -2.0), "mdlm": (-0.048, 3.2 + 0.048 * math.log(14), 0.52, -2.6)}
    rows = _synthetic(laws, BUDGETS, sizes_per_budget=5)

    def write(name, rs):
        path = tmp_path / name
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["method", "flops", "params", "loss", "tokens"])
            w.writeheader()
            w.writerows(rs)
        return path

    whole = report.fit_source(write("whole.csv", rows), n_boot=20)
    half = len(rows) // 2
    a, b = write("a.csv", rows[: half + 3]), write("b.csv", rows[half:])  # three rows in both
    both = report.fit_source([a, b], n_boot=20)
    assert len(both["points"]) == len(rows) and sum("counted once" in w for w in both["warnings"]) == 3
    for m in laws:
        for k in ("alpha", "alpha_prime", "compute_multiplier"):
            assert both["methods"][m][k] == pytest.approx(whole["methods"][m][k], rel=1e-9), (m, k)
    clash = write("clash.csv", [{**rows[0], "loss": rows[0]["loss"] * 1.1}])
    p = _cli("fit", str(a), str(clash), "--bootstrap", "5", check=False)
    assert p.returncode == 2 and p.stderr.startswith("replaid: error:") and "another loss" in p.stderr


# ------------------------------------------------------------------ plan -> run -> fit

DEBUG = [
    "data.max_docs=200",
    "data.bpe_vocab_size=300",
    "data.seq_len=16",
    "train.batch_size=8",
    "eval.max_batches=2",
    "eval.batch_size=8",
    "eval.t_samples=1",
    "train.num_threads=1",
    "diffusion.schedule_hidden=16",
]


def _env():
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def _cli(*args, check=True):
    p = subprocess.run(
        [sys.executable, "-m", "replaid", "scaling", *args], capture_output=True, text=True, cwd=ROOT, env=_env()
    )
    if check:
        assert p.returncode == 0, p.stderr[-2000:]
    return p


def test_run_resumes_an_interrupted_run_and_skips_a_finished_one(tmp_path, monkeypatch):
    """A run stopped after its first checkpoint is 'partial' and its command resumes it; the
    DebugExecutor's job (in-process) finishes it; a second pass has nothing to do."""
    pytest.importorskip("submitit")
    from replaid.config import RunConfig
    from replaid.eval.evaluate import evaluate
    from replaid.training.train import train

    monkeypatch.setenv("REPLAID_CACHE_DIR", str(tmp_path / "cache"))
    plan = sc.make_plan(["ar"], [2e8], "32x1", per_budget=0, overrides=DEBUG)
    sc.write_plan(plan, tmp_path)
    (e,) = sc.read_manifest(tmp_path)
    assert runner.run_status(tmp_path, e) == ("new", 0)
    cfg = RunConfig.from_dict(json.loads((tmp_path / e.config).read_text()))
    assert 0 < cfg.train.save_every < cfg.train.steps
    train(cfg, tmp_path / e.run_dir, evaluate=evaluate, progress=False, stop_after=cfg.train.save_every)
    assert runner.run_status(tmp_path, e) == ("partial", cfg.train.save_every)
    assert "--resume" in runner.train_command(tmp_path, e, "replaid")
    res = runner.run_submitit(tmp_path, [e], executor="debug", log=lambda s: None)
    assert res[0]["state"] == "done" and runner.run_status(tmp_path, e)[0] == "done"
    log = (tmp_path / "logs" / f"{e.id}.log").read_text()
    assert "--resume" in log
    assert runner.run_submitit(tmp_path, [e], executor="debug", log=lambda s: None) == []
    job = runner.RunJob(str(tmp_path), e, "replaid")
    assert type(job.checkpoint()).__name__ == "DelayedSubmission"  # requeue on preemption


def test_slurm_without_sbatch_is_a_one_line_error(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    monkeypatch.setenv("PATH", str(tmp_path))
    plan = sc.make_plan(["ar"], [2e7], "32x1", per_budget=0, overrides=DEBUG)
    sc.write_plan(plan, tmp_path / "sw")
    from replaid.cli import main

    assert main(["scaling", "run", str(tmp_path / "sw"), "--executor", "slurm"]) == 2


@pytest.mark.slow
def test_plan_run_fit_end_to_end_with_local_and_submitit_executors(tmp_path):
    """Debug-size study: AR through the local executor (2 subprocesses at a time), MDLM through
    submitit's LocalExecutor, then the fit of the sweep folder."""
    pytest.importorskip("submitit")
    sweep = tmp_path / "sweep"
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    _cli(
        "plan",
        "--methods",
        "ar",
        "mdlm",
        "--sizes",
        "32x1,32x2,48x2",
        "--budgets",
        "1e8",
        "3e8",
        "--per-budget",
        "0",
        "--out",
        str(sweep),
        *DEBUG,
        cache,
    )
    p = _cli("run", str(sweep), "--only", "ar", "--max-parallel", "2", "--no-progress")
    assert "3/6 runs done" in p.stderr or "6/6" in p.stderr
    _cli("run", str(sweep), "--only", "mdlm", "--executor", "submitit-local", "--max-parallel", "3")
    assert "12/12 runs done" in _cli("run", str(sweep), "--status").stdout
    out = tmp_path / "fit"
    res = json.loads(_cli("fit", str(sweep), "--out", str(out), "--json", "--bootstrap", "20").stdout)
    assert set(res["methods"]) == {"ar", "mdlm"} and res["budgets"] == [1e8, 3e8]
    assert all(len(mo["budgets"]) == 2 for mo in res["methods"].values())
    assert (out / "isoflop.png").is_file() and (out / "report.md").is_file()


def test_max_tokens_corpus_counts_one_pass_and_keeps_every_run_within_it(tmp_path):
    """``--max-tokens corpus``: one pass over the train split in whole sequences (independently: the
    split's token count from ``replaid.data.describe``, floored to L), and no planned run reads more."""
    from replaid.data import describe

    words = "the of and a to in is was he for it with as his on be at by had are but from or".split()
    rng = np.random.default_rng(0)
    src = tmp_path / "corpus"
    src.mkdir()
    for split, n in (("train", 300), ("valid", 20)):
        with open(src / f"{split}.jsonl", "w") as f:
            for _ in range(n):
                f.write(json.dumps({"text": " ".join(rng.choice(words, 40))}) + "\n")
    cache = tmp_path / "cache"
    over = [f"data.source={src}", f"data.cache_dir={cache}", "data.bpe_vocab_size=300", "data.seq_len=16"]
    n_tok = describe(str(src), "bpe", vocab_size=300, cache_dir=cache)["tokens"]
    expect = n_tok // 16 * 16
    cfg = sc.make_plan(["ar"], [1e9], "tiny", per_budget=1, overrides=over).entries[0]._cfg
    assert sc.corpus_tokens(cfg) == expect
    p = _cli(
        "plan", "--methods", "ar", "mdlm", "--sizes", "tiny", "--budgets", "1e9", "3e9", "--max-tokens", "corpus", *over
    )
    assert f"corpus: {expect:,} train tokens" in p.stderr and "passes" in p.stdout
    runs = json.loads(
        _cli(
            "plan",
            "--methods",
            "ar",
            "--sizes",
            "tiny",
            "--budgets",
            "1e9",
            "3e9",
            "--json",
            "--max-tokens",
            "corpus",
            *over,
        ).stdout
    )["runs"]
    assert len(runs) == 8 and max(r["tokens"] for r in runs) <= expect
    assert (
        max(
            r["tokens"]
            for r in json.loads(
                _cli("plan", "--methods", "ar", "--sizes", "tiny", "--budgets", "1e9", "3e9", "--json", *over).stdout
            )["runs"]
        )
        > expect
    )
    bad = _cli("plan", "--methods", "ar", "--sizes", "tiny", "--max-tokens", "lots", *over, check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("replaid: error: --max-tokens")
