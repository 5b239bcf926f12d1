"""Multi-seed grids (replaid.eval.grid): specs, planning, the report's statistics."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from replaid.config import ConfigError
from replaid.eval.grid import GridSpec, load_spec, plan, report, report_markdown, spec_from_dict

T975_2 = 4.302652729911275  # t_{0.975, 2}


def test_spec_cells_and_vary_product():
    s = spec_from_dict(
        {
            "base": "debug",
            "seeds": 2,
            "cells": {"a": ["model.d_e=8"]},
            "vary": {"diffusion.schedule": ["learned", "linear"], "model.self_conditioning": [True]},
        }
    )
    cells = s.cell_overrides()
    assert list(cells) == [
        "a",
        "diffusion.schedule=learned,model.self_conditioning=true",
        "diffusion.schedule=linear,model.self_conditioning=true",
    ]
    assert s.seeds == [0, 1]


@pytest.mark.parametrize(
    "bad, msg",
    [
        ({"seeds": [0, 0]}, "distinct"),
        ({"cells": {"a b": []}}, "rename"),
        ({"cells": {"a": ["nokey"]}}, "key=value"),
        ({"reference": "zz", "cells": {"a": []}}, "not a cell"),
        ({"colour": 1}, "unknown key"),
        ({"vary": {"x": []}}, "non-empty"),
    ],
)
def test_spec_refuses_bad_input(bad, msg):
    with pytest.raises(ConfigError, match=msg):
        spec_from_dict({"base": "debug", **bad})


def test_load_spec_names_the_file(tmp_path):
    p = tmp_path / "g.json"
    p.write_text('{"base": ')
    with pytest.raises(ConfigError, match="g.json line 1"):
        load_spec(p)
    p.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_spec(p)


def test_plan_resolves_every_cell_and_seed():
    s = GridSpec("debug", ["train.steps=3"], [0, 5], {"ref": [], "nosc": ["model.self_conditioning=false"]})
    runs = plan(s)
    assert [r.id for r, _ in runs] == ["ref__s0", "ref__s5", "nosc__s0", "nosc__s5"]
    cfgs = {r.id: c for r, c in runs}
    assert cfgs["nosc__s5"].train.seed == 5 and not cfgs["nosc__s5"].model.self_conditioning
    assert cfgs["ref__s0"].train.steps == 3 and cfgs["ref__s0"].model.self_conditioning
    with pytest.raises(ConfigError, match="grid cell 'bad'"):
        plan(GridSpec("debug", [], [0], {"bad": ["model.no_such_key=1"]}))


def rows(cell, vals, uni=6.0):
    return [
        {"cell": cell, "seed": s, "value": v, "kind": "NELBO", "unigram": uni, "split": "test"}
        for s, v in enumerate(vals)
    ]


def test_report_paired_interval_matches_float64():
    ref, other = [5.58, 5.61, 5.55], [5.45, 5.50, 5.47]
    rep = report(rows("replaid", ref) + rows("fix", other), reference="replaid", cell_order=["replaid", "fix"])
    fix = rep["cells"][1]
    d = np.array(other, dtype=np.float64) - np.array(ref, dtype=np.float64)
    half = T975_2 * d.std(ddof=1) / math.sqrt(3)
    assert fix["paired"]["diff_mean"] == pytest.approx(d.mean(), abs=1e-12)
    assert fix["paired"]["diff_lo"] == pytest.approx(d.mean() - half, abs=1e-10)
    assert fix["paired"]["diff_hi"] == pytest.approx(d.mean() + half, abs=1e-10)
    assert fix["paired"]["verdict"] == "lower"
    x = np.array(other)
    assert fix["lo"] == pytest.approx(x.mean() - T975_2 * x.std(ddof=1) / math.sqrt(3))
    assert fix["below_unigram"] == pytest.approx(6.0 - x.mean()) and fix["on_plateau"] is False
    md = report_markdown(rep)
    assert "| fix | 3 |" in md and "lower" in md
    json.dumps(rep)  # JSON-able


def test_report_flags_plateau_and_not_determined():
    rep = report(rows("a", [5.9, 5.8, 5.85]) + rows("b", [5.7, 5.95, 5.8]), reference="a")
    b = rep["cells"][1]
    assert rep["cells"][0]["on_plateau"] is True and b["paired"]["verdict"] == "not determined"
    assert "**plateau**" in report_markdown(rep)
    with pytest.raises(ValueError, match="non-finite"):
        report(rows("a", [float("nan")]))
    with pytest.raises(ConfigError, match="no finished run"):
        report(rows("a", [5.0]), reference="b")


def test_report_orderings_holds_reversed_not_determined():
    """Each claim "A < B" is the paired A - B interval: below 0 holds, above reversed, else not determined."""
    a, b, c = [5.40, 5.46, 5.43], [5.50, 5.52, 5.55], [5.30, 5.70, 5.45]
    rep = report(
        rows("a", a) + rows("b", b) + rows("c", c),
        orderings=["a < b", "b < a", "a > b", "a < c", "a < d"],
        paper={"a": "PPL 22.1"},
    )
    v = {o["claim"]: o for o in rep["orderings"]}
    assert [v[k]["verdict"] for k in ("a < b", "b < a", "a > b", "a < c")] == [
        "holds",
        "reversed",
        "reversed",
        "not determined",
    ]
    d = np.array(a) - np.array(b)
    assert v["a < b"]["diff_hi"] == pytest.approx(d.mean() + T975_2 * d.std(ddof=1) / math.sqrt(3), abs=1e-10)
    assert v["a < d"]["verdict"] == "no runs"
    md = report_markdown(rep)
    assert "| a < b | 3 |" in md and "| PPL 22.1 |" in md
    plateau = report(rows("a", a, uni=5.5) + rows("b", b, uni=5.5), orderings=["a < b"])
    assert plateau["orderings"][0]["verdict"] == "holds (a cell is on the plateau)"


@pytest.mark.parametrize(
    "orderings, msg", [(["a < zz"], "not a cell"), (["a << b"], "must read"), (["a"], "must read")]
)
def test_spec_refuses_bad_orderings(orderings, msg):
    with pytest.raises(ConfigError, match=msg):
        spec_from_dict({"base": "debug", "cells": {"a": [], "b": []}, "orderings": orderings})


@pytest.mark.slow
def test_grid_plan_run_report_end_to_end(tmp_path, capsys):
    """2 cells x 3 seeds at debug size through the CLI, local executor; the paired interval of the
    report equals a float64 t-interval computed here from the runs' own final evaluations."""
    from replaid.cli import main

    g = tmp_path / "g"
    over = ["train.steps=4", "eval.max_batches=1", "train.log_every=2", "train.num_threads=1"]
    argv = ["grid", "plan", "--base", "debug", "--out", str(g), "--seeds", "3", "--reference", "ref"]
    argv += ["--cell", "ref", "--cell", "nosc", "model.self_conditioning=false", "--", *over]
    assert main(argv) == 0
    assert "2 cells x 3 seeds = 6 runs" in capsys.readouterr().out
    assert main(["grid", "plan", "--base", "debug", "--out", str(g), "--cell", "x"]) == 2  # never re-planned
    run = ["grid", "run", str(g), "--python", "inprocess", "--no-progress"]
    assert main([*run, "--seeds", "5", "6"]) == 2  # no run has those seeds: one line, nothing trained
    assert "no run of" in capsys.readouterr().err and not (g / "runs").exists()
    assert main([*run, "--seeds", "0", "2"]) == 0  # those seeds only, every cell
    assert sorted(p.name for p in (g / "runs").iterdir()) == ["nosc__s0", "nosc__s2", "ref__s0", "ref__s2"]
    assert main([*run, "--seeds", "1", "--only", "ref"]) == 0  # a count (seed 0, done) and a cell: nothing new
    assert len(list((g / "runs").iterdir())) == 4
    assert main(run) == 0
    runs = sorted(p.name for p in (g / "runs").iterdir())
    assert runs == [f"{c}__s{s}" for c in ("nosc", "ref") for s in range(3)]
    before = {r: (g / "runs" / r / "final_eval.json").read_bytes() for r in runs}
    assert main(["grid", "run", str(g), "--python", "inprocess", "--no-progress"]) == 0  # all done: skipped
    assert before == {r: (g / "runs" / r / "final_eval.json").read_bytes() for r in runs}
    assert main(["grid", "report", str(g), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    vals = {}
    for r in runs:
        ev = json.loads((g / "runs" / r / "final_eval.json").read_text())["eval"]
        vals[r] = ev["nelbo_nats_per_token"]
    d = np.array([vals[f"nosc__s{s}"] - vals[f"ref__s{s}"] for s in range(3)], dtype=np.float64)
    nosc = next(c for c in rep["cells"] if c["cell"] == "nosc")
    half = T975_2 * d.std(ddof=1) / math.sqrt(3)
    assert nosc["paired"]["diff_mean"] == pytest.approx(d.mean(), abs=1e-12)
    assert nosc["paired"]["diff_lo"] == pytest.approx(d.mean() - half, abs=1e-10)
    assert nosc["paired"]["diff_hi"] == pytest.approx(d.mean() + half, abs=1e-10)
    assert nosc["values"] == [vals[f"nosc__s{s}"] for s in range(3)]
    assert (g / "report.md").is_file() and (g / "report.png").stat().st_size > 1000
    # plateau exit: recomputed from each run's logged rows (bound and its tokens' unigram NLL)
    for c in rep["cells"]:
        assert len(c["plateau_exits"]) == 3
        for s, got in zip(c["seeds"], c["plateau_exits"], strict=True):
            rows = [
                json.loads(x) for x in (g / "runs" / f"{c['cell']}__s{s}" / "metrics.jsonl").read_text().splitlines()
            ]
            rows = [r for r in rows if "loss" in r]
            assert all(r["unigram"] > 0 for r in rows)
            ok = [r["unigram"] - r["loss"] >= 0.3 for r in rows]
            want = next((r["step"] for i, r in enumerate(rows) if all(ok[i:])), None)
            assert got == want
    assert "plateau exit (step)" in (g / "report.md").read_text()
    # the plateau signatures beside the exits: every seed's logged values, the deepest layer's per-layer keys
    from replaid.scaling.grid import read_grid, signature_series

    assert "signatures.png" in (g / "report.md").read_text() and (g / "signatures.png").stat().st_size > 1000
    sig = signature_series(g, read_grid(g)[1])
    assert set(sig["kl_unigram/t0.5"]) == {"ref", "nosc"} and len(sig["kl_unigram/t0.5"]["ref"]) == 3
    assert "sc_cosine" in sig and set(sig["sc_cosine"]) == {"ref"}  # only the self-conditioned cell feeds back
    rows = [json.loads(x) for x in (g / "runs" / "ref__s1" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    deepest = max(int(k.split("/")[1]) for k in rows[0] if k.startswith("attn_entropy/"))
    assert sig["attn_entropy/last"]["ref"][1] == (
        [r["step"] for r in rows],
        [r[f"attn_entropy/{deepest}"] for r in rows],
    )
    assert main(["grid", "report", str(g), "--reference", "nope"]) == 2


def test_report_plateau_exit_per_cell_with_interval_only_when_every_seed_left():
    rows = [
        {"cell": "a", "seed": s, "value": 5.0, "kind": "NELBO", "unigram": 6.0, "plateau_exit": x}
        for s, x in enumerate([300, 450, 600])
    ] + [
        {"cell": "b", "seed": s, "value": 5.5, "kind": "NELBO", "unigram": 6.0, "plateau_exit": x}
        for s, x in enumerate([500, None, 700])
    ]
    rep = report(rows, "a")
    a, b = rep["cells"]
    x = np.array([300, 450, 600], dtype=np.float64)
    half = T975_2 * x.std(ddof=1) / math.sqrt(3)
    m, lo, hi = x.mean(), x.mean() - half, x.mean() + half
    assert (a["plateau_exit_mean"], a["plateau_exit_lo"], a["plateau_exit_hi"]) == pytest.approx((m, lo, hi))
    assert b["plateau_exits"] == [500, None, 700] and b["plateau_not_left"] == 1 and b["plateau_exit_mean"] is None
    md = report_markdown(rep)
    assert "300 450 600: 450 [" in md and "500 - 700 (1 not left)" in md


def test_training_logs_the_unigram_nll_of_the_rows_tokens(tmp_path):
    """Each logged row's ``unigram`` is the add-one unigram NLL (fitted on the train split) of exactly the
    tokens of the steps it averages, recomputed here from the loader (same seed, same order)."""
    from replaid.data.pipeline import DataPipeline
    from replaid.eval.evaluate import evaluate
    from replaid.presets import resolve
    from replaid.training.train import train

    cfg = resolve("debug", None, ["train.steps=6", "train.log_every=3", "eval.max_batches=1", "train.num_threads=1"])
    train(cfg, tmp_path / "r", progress=False, evaluate=evaluate)
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    pipe = DataPipeline(cfg, tmp_path / "r")
    logp = pipe.unigram_logp()
    batches = [next(pipe.train_iter)["tokens"].numpy() for _ in range(6)]
    for r, window in zip(rows, (batches[:3], batches[3:]), strict=True):
        toks = np.concatenate([b.reshape(-1) for b in window])
        assert r["unigram"] == pytest.approx(float(-logp[toks].mean()), rel=1e-12)


def test_training_curves_read_each_run_and_keep_the_last_of_a_repeated_step(tmp_path):
    """A resumed run logs a step twice: the curve keeps the later row; eval rows and bad lines are skipped."""
    from replaid.scaling.grid import GridEntry, training_curves

    run = tmp_path / "runs" / "a__s1"
    run.mkdir(parents=True)
    lines = [
        {"step": 10, "loss": 7.0},
        {"step": 20, "loss": 6.5},
        {"step": 20, "loss": 6.4},  # resumed from step 10: the second row is the one that counts
        {"step": 20, "eval/nelbo_nats_per_token": 6.0},
        {"step": 30, "loss": 6.3, "nelbo": 6.1},  # low-variance MDLM: its logged NELBO
    ]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n{broken\n")
    e = GridEntry("a__s1", "a", 1, [], "runs/a__s1", "configs/a__s1.json", 3, 1.0)
    gone = GridEntry("b__s0", "b", 0, [], "runs/b__s0", "configs/b__s0.json", 3, 1.0)
    assert training_curves(tmp_path, [e, gone]) == {"a": {1: ([10, 20, 30], [7.0, 6.4, 6.1])}}
