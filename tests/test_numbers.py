"""Issue 38, class 3: numbers are validated where they enter. The one-line refusals of each case id are rows
of tests/test_bad_inputs.py's table (X09-X11, J02, O24, L04, K06, K07, U10); here the library-level
checks behind them, and the two bugs that need more than a range: a scaling fit whose vertex leaves the
finite range (F06) and the adaptive ODE solver's step budget."""

import contextlib
import csv
import io
import math
import re
import time
from pathlib import Path

import pytest

from replaid.cli import main
from replaid.config import ConfigError, RunConfig, set_key


def run_main(argv: list[str]) -> tuple[int, list[str]]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, [ln for ln in err.getvalue().replace("\r", "\n").splitlines() if ln.strip()]


# ---------------------------------------------------------------- F06: a fit beyond the finite range


def flat_isoflop_csv(path: Path) -> Path:
    """12 well-formed rows (3 budgets x 4 sizes, losses 3.2-4): log L falls almost linearly in log N with a
    curvature of 1e-5, so each budget's quadratic has its vertex near N = exp(5000)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["method", "flops", "params", "loss"])
        w.writeheader()
        for b in (1e15, 1e16, 1e17):
            for n in (1e6, 2e6, 4e6, 8e6):
                x = math.log(n / 1e6)
                w.writerow(
                    {"method": "ar", "flops": b, "params": n, "loss": round(4.0 * math.exp(-0.1 * x + 1e-5 * x * x), 6)}
                )
    return path


def test_f06_a_vertex_beyond_the_finite_range_is_a_degenerate_fit(tmp_path):
    from replaid.scaling.fit import fit_points, isoflop_min, read_points

    csv_path = flat_isoflop_csv(tmp_path / "f06.csv")
    rows = read_points(csv_path)
    assert len(rows) == 12 and all(3 < r["loss"] <= 4 for r in rows)
    q = isoflop_min(*[__import__("numpy").log([r[k] for r in rows[:4]]) for k in ("params", "loss")])
    assert math.isnan(q["log_n_opt"]) and q["vertex_beyond"] > 709  # not an N* that exp() cannot give
    res = fit_points(rows, n_boot=4)  # was: OverflowError: math range error (scaling/fit.py)
    assert any("degenerate: the quadratic is nearly flat" in w for w in res["warnings"])
    assert all(b["n_opt"] is None or math.isfinite(b["n_opt"]) for b in res["methods"]["ar"]["budgets"])
    code, err = run_main(["scaling", "fit", str(csv_path), "--bootstrap", "4", "--out", str(tmp_path / "fit")])
    assert code == 0 and not any("Traceback" in ln or "error" in ln for ln in err), err
    assert any("degenerate" in ln for ln in err)


# ---------------------------------------------------------------- the adaptive ODE solver's budget


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    r = tmp_path_factory.mktemp("numbers") / "run"
    assert (
        main(["train", "--preset", "debug", "--out", str(r), "--no-progress", "train.steps=2", "eval.max_batches=1"])
        == 0
    )
    return r


def test_an_exhausted_solver_budget_is_one_line_and_exit_2_quickly(run, tmp_path):
    out = tmp_path / "lk"
    t0 = time.time()
    code, err = run_main(
        [
            "likelihood",
            str(run),
            "--solver",
            "dopri5",
            "--rtol",
            "1e-12",
            "--atol",
            "1e-12",
            "--max-solver-steps",
            "3",
            "--num-seqs",
            "1",
            "--K",
            "1",
            "--out",
            str(out),
        ]
    )
    errors = [ln[ln.index("replaid: error: ") :] for ln in err if "replaid: error: " in ln]
    assert code == 2 and len(errors) == 1, err
    assert "ran out of its step budget" in errors[0] and "--max-solver-steps 3" in errors[0]
    assert time.time() - t0 < 60 and not out.exists()


def test_solver_tolerances_below_float64_resolution_are_refused():
    import torch

    from replaid.eval.likelihood import _solve_adaptive

    with pytest.raises(ValueError, match=r"--rtol 1e-300: must be in \[1e-12, 1\]"):
        _solve_adaptive(None, torch.zeros(1, 2, 2), -3.0, 6.0, 1e-300, 1e-5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--max-solver-steps 0"):
        _solve_adaptive(None, torch.zeros(1, 2, 2), -3.0, 6.0, 1e-5, 1e-5, max_steps=0)  # type: ignore[arg-type]


# ---------------------------------------------------------------- ranges behind the table's rows


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("optim.lr_backbone", "1e300", "must be in [0, 10]"),  # O24: was a RuntimeError in Adam's step
        ("optim.wd_backbone", "1e5", "must be in [0, 10]"),
        ("optim.eps", "1e-300", "must be in [1e-30, 1]"),
        ("model.dropout", "1e-300", "beyond the range float32 computes in"),
        ("optim.grad_clip", "1e31", "beyond the range float32 computes in"),
        ("diffusion.gamma_1", "1e300", "beyond the range float32 computes in"),
    ],
)
def test_config_floats_stay_in_their_range(key, value, needle):
    cfg = RunConfig()
    set_key(cfg, key, value)
    with pytest.raises(ConfigError, match=f"{key}: .*{re.escape(needle)}"):
        cfg.validate()


def test_ordinary_config_floats_still_pass():
    from replaid.presets import PRESETS, resolve

    for name in PRESETS:
        resolve(name, None, []).validate()  # every preset's numbers are in range
    cfg = RunConfig()
    for key, value in (("optim.lr_backbone", "0"), ("optim.lr_norms_head", "-1"), ("optim.eps", "1e-8")):
        set_key(cfg, key, value)
    cfg.validate()


def test_k06_k07_plans_refuse_a_budget_below_one_step_and_budgets_that_share_an_id():
    from replaid.scaling.plan import make_plan

    with pytest.raises(ConfigError, match="below one training step of every size of ar"):
        make_plan(["ar"], [1.0], "tiny", per_budget=4)  # K06: was 4 runs of 1.2e8-2.8e9 FLOPs each
    with pytest.raises(ConfigError, match="same budget to 3 significant digits"):
        make_plan(["ar"], [1e11, 1e11], "tiny", per_budget=4)  # K07: was 8 entries under 4 ids
    plan = make_plan(["ar"], [1e11, 3e11], "tiny", per_budget=4)
    assert len({e.id for e in plan.entries}) == len(plan.entries) == 8


def test_u10_rows_of_different_vocabularies_are_refused(tmp_path):
    from replaid.eval.quality import read_samples

    f = tmp_path / "s.jsonl"
    f.write_text(
        '{"text": "a", "ids": [1, 2], "vocab_size": 512}\n{"text": "b", "ids": [3, 50000], "vocab_size": 50257}\n'
    )
    with pytest.raises(ValueError, match='line 2: field "vocab_size" is 50257, but line 1 has 512'):
        read_samples(str(f))
    f.write_text('{"text": "a", "ids": [1], "vocab_size": 512}\n{"text": "b", "ids": [3], "vocab_size": 512}\n')
    assert read_samples(str(f))[1] == [[1], [3]]


def test_temperature_zero_stays_greedy_and_tiny_ones_are_refused():
    import argparse

    from replaid.cli import _parser

    p = _parser()
    assert p.parse_args(["sample", "r", "--temperature", "0"]).temperature == 0.0
    assert p.parse_args(["sample", "r", "--temperature", "1e-6"]).temperature == 1e-6
    for v in ("1e-300", "1e-7", "1e300", "2e6"):
        with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            p.parse_args(["sample", "r", "--temperature", v])
    assert isinstance(p, argparse.ArgumentParser)
