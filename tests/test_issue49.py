"""Issue 49: D31, K10, strict JSON and the over-training verdict (each seen failing on the old code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replaid.cli import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("i49") / "run"
    assert main(["train", "--preset", "debug", "--out", str(run), "--no-progress", "train.steps=2",
                 "eval.max_batches=1"]) == 0  # fmt: skip
    return run


def one_line(capsys, rc: int) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("replaid: error: "), (rc, err)
    return err[0]


@pytest.mark.parametrize(
    "split, field",
    [({"decay": "x"}, "method_state.split.decay"), ({"decay": 0.9}, "method_state.split.n"), (5, "split"),
     ({"decay": 0.9, "n": 3, "m_r": 0, "s_r": 0, "m_d": 0, "s_d": 0, "host_std": ["a", 1]}, "host_std")],
)  # fmt: skip
@pytest.mark.parametrize("command", ["eval", "sample"])
def test_d31_a_damaged_method_state_is_one_line_naming_the_field(trained, tmp_path, capsys, split, field, command):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    st_file = run / "checkpoints" / "step_0000002" / "state.json"
    st = json.loads(st_file.read_text())
    st["method_state"]["split"] = split
    st_file.write_text(json.dumps(st))
    before = st_file.read_bytes()
    capsys.readouterr()
    argv = ["eval", str(run), "--max-batches", "1"] if command == "eval" else ["sample", str(run), "--num", "1",
                                                                                "--steps", "2"]  # fmt: skip
    line = one_line(capsys, main(["--no-verify", *argv]))
    assert "state.json" in line and field in line, line
    assert st_file.read_bytes() == before


@pytest.mark.parametrize("value", ["nan", "ar=nan", "inf", "ar=-inf", "0", "-5", "1e30"])
def test_k10_tokens_per_param_must_be_finite_and_positive(tmp_path, capsys, value):
    argv = ["scaling", "plan", "--methods", "ar", "--sizes", "32x1", "--budgets", "1e9", "--per-budget", "0",
            "--tokens-per-param", value, "--out", str(tmp_path / "p")]  # fmt: skip
    capsys.readouterr()
    line = one_line(capsys, main(argv))
    assert "--tokens-per-param" in line and "finite" in line, line
    assert not (tmp_path / "p").exists()


def test_overtrain_with_one_seed_per_budget_names_the_real_cause_and_writes_strict_json(tmp_path, capsys):
    """The battery's case: one seed per budget; the ranges overlap at 2e12-4e12. The verdict said "the
    two methods' FLOPs ranges do not overlap", and overtrain.json held a bare NaN."""
    import csv
    import math

    src = tmp_path / "runs.csv"
    with open(src, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["method", "flops", "params", "loss", "seed", "tokens"])
        w.writeheader()
        for m, budgets in (("a", [2e12, 4e12, 8e12]), ("b", [1e12, 2e12, 4e12])):
            for c in budgets:
                w.writerow({"method": m, "flops": c, "params": 4e4, "tokens": c / 4e5, "seed": 0,
                            "loss": 5 - 0.3 * math.log10(c / 1e11)})  # fmt: skip
    out = tmp_path / "out"
    rc = main(["scaling", "overtrain", str(src), "--optimum", "a=2e12", "b=1e12", "--out", str(out)])
    assert rc == 0
    text = (out / "overtrain.json").read_text()
    res = json.loads(text, parse_constant=lambda c: pytest.fail(f"overtrain.json holds a bare {c}"))
    assert "do not overlap" not in res["verdict"]
    assert "2e+12-4e+12" in res["verdict"] and "seeds" in res["verdict"], res["verdict"]


def test_strict_json_writes_null_for_non_finite_numbers():
    from replaid.schema import dumps

    s = dumps({"a": float("nan"), "b": [1.0, float("inf"), (float("-inf"), 2)], "c": "NaN"})
    assert json.loads(s, parse_constant=lambda c: pytest.fail(c)) == {
        "a": None,
        "b": [1.0, None, [None, 2]],
        "c": "NaN",
    }


def test_no_json_dumps_without_the_strict_writer_in_the_package():
    """Every JSON the package writes goes through replaid.schema.dumps (allow_nan=False, null for NaN)."""
    import re

    src = Path(__file__).resolve().parents[1] / "src" / "replaid"
    bad = [f"{p.relative_to(src)}:{i}" for p in src.rglob("*.py") if p.name != "schema.py"
           for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\bjson\.dumps\(", line)]  # fmt: skip
    assert not bad, bad
