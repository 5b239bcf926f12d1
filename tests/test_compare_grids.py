"""scripts/compare_grids.py (issue 33's before/after re-run): the figures it writes are recomputed from the
two reports' per-seed values here (numpy / scipy), and a moved verdict is flagged."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from replaid.eval.grid import report

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("compare_grids", REPO / "scripts" / "compare_grids.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _report(path: Path, values: dict[str, list[float]]) -> Path:
    rows = [
        {"cell": c, "seed": s, "value": v, "kind": "NELBO", "unigram": 6.0}
        for c, vs in values.items()
        for s, v in enumerate(vs)
    ]
    path.write_text(json.dumps(report(rows, "a", orderings=["a < b"])))
    return path


def test_compare_recomputes_means_sds_and_flags_a_moved_verdict(tmp_path, capsys):
    before = {"a": [4.0, 4.1, 4.05], "b": [4.5, 4.6, 4.55]}  # a < b holds
    after = {"a": [4.0, 4.6, 4.2], "b": [4.3, 4.2, 4.5]}  # a - b = -0.3, +0.4, -0.3: not determined
    mod = _script()
    out = tmp_path / "cmp.json"
    assert (
        mod.main(
            [str(_report(tmp_path / "b.json", before)), str(_report(tmp_path / "a.json", after)), "--out", str(out)]
        )
        == 0
    )
    cmp = json.loads(out.read_text())
    a = cmp["cells"]["a"]
    assert a["mean_change"] == pytest.approx(np.mean(after["a"]) - np.mean(before["a"]), abs=1e-12)
    assert a["sd_ratio"] == pytest.approx(np.std(after["a"], ddof=1) / np.std(before["a"], ddof=1), rel=1e-12)
    d = np.subtract(after["a"], after["b"])
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
    o = cmp["orderings"]["a < b"]
    assert o["after"]["diff_lo"] == pytest.approx(d.mean() - half, abs=1e-12)
    assert (o["before"]["verdict"], o["after"]["verdict"], o["verdict_moved"]) == ("holds", "not determined", True)
    assert o["after"]["p"] == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue)
    assert o["after"]["p_holm"] == pytest.approx(o["after"]["p"])  # one ordering: Holm = the raw p
    assert "| a < b |" in capsys.readouterr().out


def test_holm_adjusts_over_the_orderings():
    mod = _script()
    diffs = {"x": [-1.0, -1.1, -0.9], "y": [-0.2, -0.25, -0.1], "z": [0.1, -0.3, 0.2]}
    ords = {k: {"after": {"diffs": d, "verdict": "holds"}} for k, d in diffs.items()}
    mod.holm(ords)
    p = sorted((stats.ttest_1samp(d, 0.0).pvalue, k) for k, d in diffs.items())
    want, run = {}, 0.0
    for i, (pv, k) in enumerate(p):
        run = max(run, min(1.0, (3 - i) * pv))
        want[k] = run
    assert {k: o["after"]["p_holm"] for k, o in ords.items()} == pytest.approx(want)
    assert ords["z"]["after"]["holm_verdict"] == "not determined"


def test_compare_refuses_a_file_that_is_no_report(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("[1]")
    with pytest.raises(SystemExit) as e:
        _script().main([str(bad), str(bad)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("replaid: error:") and "x.json" in err and "\n" not in err
