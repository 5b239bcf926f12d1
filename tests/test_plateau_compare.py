"""scripts/plateau_compare.py (issue 34 §1): each run's plateau exit and tabulated quantities, read from
planted metrics rows of a planned grid."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from replaid.eval.grid import GridSpec
from replaid.scaling.grid import write_grid

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("plateau_compare", REPO / "scripts" / "plateau_compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_exit_and_quantities_from_planted_rows(tmp_path, capsys):
    g = tmp_path / "g"
    write_grid(
        GridSpec(base="debug", cells={"a": [], "b": ["model.self_conditioning=false"]}, seeds=[0, 1]).validate(), g
    )
    # a__s0 leaves at 150; a__s1 dips below at 100 and returns: leaves at 200; b's never leave
    below = {"a__s0": [0.1, 0.2, 0.35, 0.4], "a__s1": [0.1, 0.35, 0.2, 0.5], "b__s0": [0.0] * 4, "b__s1": [0.1] * 4}
    for rid, bs in below.items():
        run = g / "runs" / rid
        run.mkdir(parents=True)
        rows = [
            {"step": 50 * (i + 1), "loss": 6.0 - b, "unigram": 6.0, "gamma_0": -3.0 + i, "grad_norm/backbone": 1.0}
            for i, b in enumerate(bs)
        ]
        rows.append({"step": 250, "loss": 1.0, "unigram": 6.0})  # beyond --until
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    assert _script().main([str(g), "--cells", "a", "b", "--until", "200", "--at", "100", "--out", str(out)]) == 0
    s = json.loads((out / "compare.json").read_text())["runs"]
    assert {k: v["plateau_exit"] for k, v in s.items()} == {"a__s0": 150, "a__s1": 200, "b__s0": None, "b__s1": None}
    assert s["a__s0"]["at"]["100"]["gamma_0"] == -2.0
    assert abs(s["a__s1"]["at"]["100"]["below_unigram"] - 0.35) < 1e-12
    assert (out / "compare.png").stat().st_size > 1000
    # a later grid's run replaces an earlier one's when it has rows (a__s1 re-logged), not when empty (b__s0)
    g2 = tmp_path / "g2"
    write_grid(
        GridSpec(base="debug", cells={"a": [], "b": ["model.self_conditioning=false"]}, seeds=[0, 1]).validate(), g2
    )
    (g2 / "runs" / "a__s1").mkdir(parents=True)
    rows = [{"step": 50 * (i + 1), "loss": 5.0, "unigram": 6.0} for i in range(4)]
    (g2 / "runs" / "a__s1" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out2 = tmp_path / "out2"
    assert _script().main([str(g), str(g2), "--cells", "a", "b", "--until", "200", "--out", str(out2)]) == 0
    s2 = json.loads((out2 / "compare.json").read_text())["runs"]
    assert (
        s2["a__s1"]["plateau_exit"] == 50 and s2["a__s0"]["plateau_exit"] == 150 and s2["b__s0"]["plateau_exit"] is None
    )
    assert _script().main([str(g), "--cells", "zz", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().startswith("replaid: error: --cells zz")
