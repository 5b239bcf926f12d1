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
