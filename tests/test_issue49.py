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
