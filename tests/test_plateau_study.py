"""The plateau study's offset and compute multiplier (issue 48 §2) against closed forms."""

from __future__ import annotations

import math

import pytest

from replaid.eval.plateau import Curve, first_crossing, interp_log_x, offset_against


def power_law(steps, flops_per_step, a=6.0, k=0.4, shift=1.0):
    """bound = a - k log(C / shift): a curve straight in log compute, ``shift`` times less efficient."""
    fl = [flops_per_step * s for s in steps]
    return Curve(steps, [a - k * math.log(c / shift) for c in fl], [7.0] * len(steps), fl)


def test_log_interpolation_and_crossing_are_exact_on_a_log_linear_curve():
    xs = [1e10, 3e10, 1e11, 4e11]
    ys = [5.0 - 0.3 * math.log(x) for x in xs]
    assert interp_log_x(xs, ys, 2e11) == pytest.approx(5.0 - 0.3 * math.log(2e11), rel=1e-12)
    assert math.isnan(interp_log_x(xs, ys, 1e12))  # outside the run: not extrapolated
    level = 5.0 - 0.3 * math.log(5e10)
    assert first_crossing(xs, ys, level) == pytest.approx(5e10, rel=1e-10)
    assert first_crossing(xs, ys, -100.0) is None
    assert first_crossing([1.0, 2.0, 4.0], [6.0, 5.0, 5.5], 5.2) == pytest.approx(2 ** (0.8), rel=1e-12)  # the first


def test_offset_and_multiplier_against_a_shifted_reference():
    steps = list(range(50, 2450, 50))
    ref = power_law(steps, 1e9)
    run = power_law(steps, 1.2e9, shift=2.5)  # 1.2x the FLOPs per step and 2.5x less efficient per FLOP
    o = offset_against(run, ref, 1200, window=1)
    assert o.flops == pytest.approx(1.2e9 * 1200)
    assert o.multiplier == pytest.approx(2.5, rel=1e-9)  # the reference reaches the bound with 2.5x less
    assert o.offset == pytest.approx(0.4 * math.log(2.5), rel=1e-9)  # k log m above it at equal compute
    same = offset_against(ref, ref, 1200, window=1)
    assert same.offset == pytest.approx(0.0, abs=1e-12) and same.multiplier == pytest.approx(1.0)


def test_bound_at_averages_the_window_and_reads_below_unigram():
    c = Curve([50, 100, 150, 200], [6.0, 5.0, 4.0, 3.0], [7.0, 7.0, 7.0, 7.5], [1.0, 2.0, 3.0, 4.0])
    assert c.bound_at(200, window=150) == pytest.approx(4.0)  # rows 100, 150, 200 (not 50)
    assert c.below_unigram_at(200, window=100) == pytest.approx(((7.0 - 4.0) + (7.5 - 3.0)) / 2)
    assert math.isnan(c.bound_at(10))


def test_study_script_on_a_planned_grid_with_known_curves(tmp_path, capsys):
    """scripts/plateau_study.py on a planned grid whose runs log curves written here: the exits, the
    paired exit differences (exact, and bounded for a run still on the plateau) and the multipliers."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from replaid.cli import main
    from replaid.config import read_run_config
    from replaid.training.flops import train_flops_per_token

    g = tmp_path / "g"
    argv = ["grid", "plan", "--base", "debug", "--out", str(g), "--seeds", "2", "--reference", "replaid"]
    argv += ["--cell", "replaid", "--cell", "mdlm", "method=mdlm", "--cell", "fast", "model.self_conditioning=false"]
    assert main([*argv, "--", "train.steps=1000"]) == 0
    capsys.readouterr()
    steps = list(range(50, 1050, 50))
    exits = {
        ("mdlm", 0): 100,
        ("mdlm", 1): 100,
        ("replaid", 0): None,
        ("replaid", 1): 900,
        ("fast", 0): 300,
        ("fast", 1): 400,
    }
    per_mdlm = 0.0  # the mdlm rows come first and set it
    for (cell, seed), ex in exits.items():
        run = g / "runs" / f"{cell}__s{seed}"
        run.mkdir(parents=True, exist_ok=True)
        cfg = read_run_config(g / "configs" / f"{cell}__s{seed}.json")
        per = train_flops_per_token(cfg, cfg.data.bpe_vocab_size) * cfg.train.batch_size * cfg.data.seq_len
        rows = []
        for s in steps:
            if ex is None or s < ex:
                b = 7.0
            elif cell == "mdlm":
                b = 7.0 - 0.5 * math.log(per * s / (per * ex)) - 0.31
            else:  # 2x less efficient per FLOP than mdlm once off the plateau
                m_ex = exits[("mdlm", seed)]
                b = 7.0 - 0.5 * math.log(per * s / 2.0 / (per_mdlm * m_ex)) - 0.31
            rows.append({"step": s, "loss": b, "unigram": 7.0})
        if cell == "mdlm":
            per_mdlm = per
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "study"
    script = Path(__file__).resolve().parents[1] / "scripts" / "plateau_study.py"
    r = subprocess.run(
        [sys.executable, str(script), str(g), "--budgets", "600", "1000", "--out", str(out), "--partial"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads((out / "study.json").read_text())
    assert d["cells"]["fast"]["exit_steps"] == [300, 400] and d["cells"]["replaid"]["exit_steps"] == [None, 900]
    paired = d["cells"]["fast"]["paired"]
    assert paired["exit_diff_exact"] == [400 - 900] and paired["exit_diff_at_most"] == [300 - 1000]
    for seed in ("0", "1"):
        # 2x up to the 150-step smoothing of two curves sampled at other FLOPs per step
        assert d["runs"]["fast"][seed]["multiplier"]["1000"] == pytest.approx(2.0, rel=0.03)
    assert d["cells"]["fast"]["multiplier_interval"]["1000"]["mean"] == pytest.approx(2.0, rel=0.03)
    assert (out / "below_unigram.png").stat().st_size > 1000

    # one arm of a grid: only the named cells, paired against the arm's own reference
    arm = tmp_path / "arm"
    argv = [
        str(g),
        "--budgets",
        "1000",
        "--out",
        str(arm),
        "--partial",
        "--cells",
        "mdlm",
        "fast",
        "--reference",
        "fast",
    ]
    r = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.loads((arm / "study.json").read_text())
    assert sorted(d["cells"]) == ["fast", "mdlm"] and sorted(d["runs"]) == ["fast", "mdlm"]
    assert d["cells"]["mdlm"]["paired"]["exit_diff_exact"] == [100 - 300, 100 - 400]


def _batch_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "plateau_batch.py"
    spec = importlib.util.spec_from_file_location("plateau_batch", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    "large, a, verdict",
    [
        ([400, 360, 440], 0.0, "a fixed number of steps"),  # the same steps at 4x the batch
        ([100, 90, 110], -1.0, "a fixed number of tokens"),  # a quarter of the steps: the same tokens
        ([200, 180, 220], -0.5, "neither"),
    ],
)
def test_the_batch_exponent_tells_steps_from_tokens(large, a, verdict):
    """exit_steps ~ batch^a between batch 32 and 128, paired by seed: the closed form log(e2/e1)/log 4 and the
    verdict; a censored seed (still on the plateau) is left out, and one seed alone decides nothing."""
    pb = _batch_script()
    small = {s: {"exit_step": e, "censored": False} for s, e in enumerate([400, 360, 440])}
    big = {s: {"exit_step": e, "censored": False} for s, e in enumerate(large)}
    jitter = {0: 1.0, 1: 1.02, 2: 0.98}  # seeds that differ a little, so the interval has a width
    big = {s: {**r, "exit_step": r["exit_step"] * jitter[s]} for s, r in big.items()}
    ex = pb.exponent(small, big, 4.0)
    want = [math.log(big[s]["exit_step"] / small[s]["exit_step"]) / math.log(4) for s in range(3)]
    assert ex["per_seed"] == pytest.approx(dict(enumerate(want)))
    assert ex["mean"] == pytest.approx(a, abs=0.02) and ex["verdict"].startswith(verdict), ex
    big[1]["censored"] = big[2]["censored"] = True
    assert pb.exponent(small, big, 4.0)["verdict"].startswith("not determined: 1 seed(s)")


def test_arms_script_tabulates_each_arm_against_its_own_mdlm_and_the_defaults(tmp_path, capsys):
    """scripts/plateau_arms.py on two planned grids (the defaults, and one arm) whose runs log curves with
    known exits: the arm's exits, and each method's exit paired against the same method at the defaults."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from replaid.cli import main

    exits = {"mdlm": (100, 150), "cooc-init": (200, 250), "replaid": (None, 900)}  # the defaults, 2 seeds
    arm = {"mdlm-lr3e-4": (300, 300), "cooc-lr3e-4": (400, 500), "replaid-lr3e-4": (None, None)}
    for name, cells in (("base", exits), ("arms", arm)):
        argv = ["grid", "plan", "--base", "debug", "--out", str(tmp_path / name), "--seeds", "2"]
        for c in cells:
            argv += ["--cell", c, "method=mdlm" if c.startswith("mdlm") else "model.self_conditioning=true"]
        assert main([*argv, "--", "train.steps=1000"]) == 0
        for c, ex in cells.items():
            for seed, e in enumerate(ex):
                run = tmp_path / name / "runs" / f"{c}__s{seed}"
                run.mkdir(parents=True, exist_ok=True)
                rows = [{"step": s, "loss": 7.0 if e is None or s < e else 6.0 - s / 1000, "unigram": 7.0}
                        for s in range(50, 1050, 50)]  # fmt: skip
                (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
                # the recipe - MDLM: 0.3, 0.4 (against the default RePlaid it would be -0.7, -0.6)
                nelbo = {"cooc": 5.3 + 0.2 * seed, "mdlm": 5.0 + 0.1 * seed}.get(c.split("-")[0], 6.0 + 0.1 * seed)
                (run / "final_eval.json").write_text(json.dumps({"eval": {"nelbo_nats_per_token": nelbo}}))
    capsys.readouterr()
    script = Path(__file__).resolve().parents[1] / "scripts" / "plateau_arms.py"
    out = tmp_path / "study"
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "base"), str(tmp_path / "arms"), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    t = json.loads((out / "arms.json").read_text())["lr3e-4"]["methods"]
    assert t["mdlm"]["exit_steps"] == [300, 300] and t["replaid"]["exit_steps"] == [None, None]
    assert t["mdlm"]["vs_defaults"]["exit_diff_exact"] == [200, 150]
    assert t["cooc"]["vs_defaults"]["exit_diff_exact"] == [200, 250]
    assert t["replaid"]["vs_defaults"]["exit_diff_exact"] == []  # on the plateau in the arm: no difference
    from scipy import stats

    lo, hi = stats.t.interval(0.95, 1, loc=0.35, scale=stats.sem([0.3, 0.4]))  # the recipe - the arm's MDLM
    d = t["cooc"]["minus_mdlm"]["eval"]
    assert (d["mean"], d["lo"], d["hi"]) == pytest.approx((0.35, lo, hi)) and t["mdlm"]["minus_mdlm"]["eval"] is None
    base = json.loads((out / "arms.json").read_text())["defaults"]["cooc"]["minus_mdlm"]["eval"]  # cooc-init - mdlm
    assert (base["mean"], base["lo"], base["hi"]) == pytest.approx((0.35, lo, hi))
    assert "| backbone LR 3e-4 | the recipe | 400, 500 |" in (out / "arms.md").read_text()
    assert (out / "exits.png").stat().st_size > 1000
