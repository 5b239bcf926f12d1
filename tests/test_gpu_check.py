"""scripts/gpu_check.sh (issue 27) without a GPU: the dry run resolves every step's command (CI runs it),
a broken command is reported as such, a run records a failing step and goes on, results of several
calls merge into one table that docs/benchmarks.md can include, and bad input is one error line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from gpu_check import base, children, cli, dryrun, plan, report  # noqa: E402
from gpu_check.record import BEGIN, END, merge, record  # noqa: E402

SCRIPT = REPO / "scripts" / "gpu_check.sh"


def _sh(*args, timeout=900):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("quick", [False, True])
def test_dry_run_resolves_every_step(quick):
    r = _sh("--dry-run", *(["--quick"] if quick else []))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "dry run: every step resolved" in out and "BAD" not in out
    planned = [s.name for s in plan.STEPS if s.quick or not quick]
    for name in ["setup", *planned]:
        assert f"[{name}]" in out, name
    n = sum(len(s.commands(plan.Ctx(quick=quick))) for s in plan.STEPS if s.name in planned)
    assert f"resolved: {n + 1}/{n + 1} commands" in out
    if not quick:  # every step of the full check is in one of the 10-minute calls it lists
        assert {x for call in plan.FULL_SPLIT for x in call.split(",")} == set(plan.STEP_NAMES)


def test_a_command_that_does_not_resolve_is_reported():
    py = sys.executable
    C = plan.Cmd
    assert not dryrun.resolve_cmd(C("script", ["benchmarks/no_such_bench.py"], 1), py)[0]
    ok, why = dryrun.resolve_cmd(C("script", ["benchmarks/bench_gpu.py", "--no-such-option"], 1), py)
    assert not ok and "rejects" in why
    assert not dryrun.resolve_cmd(C("child", ["x", "--child", "nope", "--spec", "{}"], 1), py)[0]
    assert not dryrun.resolve_cmd(C("child", ["x", "--child", "bf16", "--spec", '{"method": 1}'], 1), py)[0]
    assert dryrun.resolve_cmd(C("child", ["x", "--child", "bf16", "--spec", '{"methods": ["ar"]}'], 1), py)[0]
    # a replaid command line is resolved by the CLI's public parse (replaid.cli.parse), not run
    assert dryrun.resolve_cmd(C("cli", ["-m", "replaid", "presets"], 1), py)[0]
    ok, why = dryrun.resolve_cmd(C("cli", ["-m", "replaid", "presets", "--no-such-option"], 1), py)
    assert not ok and "replaid rejects" in why and "--no-such-option" in why
    # a planted bug: the sampler benchmark goes missing, so the dry run fails and names it
    steps = [plan.Step("sampler", "t", True, (1, 1), lambda ctx: [C("script", ["benchmarks/bench_missing.py"], 1)])]
    a = cli.build_parser().parse_args(["--dry-run"])
    assert dryrun.dry_run(a, steps) == 1


def test_bad_input_is_one_error_line(tmp_path):
    for args, what in [
        (["--steps", "speed,warp"], "unknown step warp"),
        (["--bogus"], "unknown option"),
        (["--merge", str(tmp_path / "none.json")], "no such file"),
        (["--record"], "--record goes"),
    ]:
        r = _sh(*args, timeout=120)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("replaid: error:") and what in lines[0], (args, r.stderr)


def test_a_failing_step_is_recorded_and_the_run_goes_on(tmp_path):
    """On a CPU the syncs step fails (it counts CUDA syncs); env still runs; both land in the JSON."""
    out = tmp_path / "out"
    rc = cli.main(["--tiny", "--device", "cpu", "--steps", "syncs,env", "--out", str(out)])
    assert rc == 1
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["steps"]["syncs"]["status"] == "fail" and "needs --device cuda" in doc["steps"]["syncs"]["error"]
    assert doc["steps"]["env"]["status"] == "ok"
    env = doc["steps"]["env"]["results"][0]["data"]
    assert env["torch"] and env["matmul_bf16_tflops"] > 0 and all(f["present"] for f in env["features"])
    md = (out / "gpu_check.md").read_text()
    assert "| syncs | fail |" in md and "| env | ok |" in md and "torch.get_autocast_dtype" in md


def _doc(step, data, started="2026-11-24T10:00:00+00:00"):
    return {
        "runs": [
            {
                "started": started,
                "mode": "full",
                "setup": {"setup_seconds": 31.0, "gpu": "NVIDIA H100", "driver": "580"},
            }
        ],
        "steps": {step: {"status": "ok", "seconds": 5.0, "results": [{"label": "", "data": data}]}},
    }


def test_merge_render_and_record(tmp_path):
    speed = {
        "method": "mdlm",
        "precision": "bf16",
        "batch": 32,
        "L": 1024,
        "step_s": 0.2,
        "tokens_per_s": 163840.0,
        "mfu": 0.41,
        "mfu_datasheet": 0.33,
        "peak_mem_gb": 30.1,
        "model_gb": 31.0,
        "warmup_s": 4.0,
        "loss": 10.9,
    }
    ref = {
        "batch": 32,
        "L": 1024,
        "step_s": 0.25,
        "tokens_per_s": 131072.0,
        "peak_mem_gb": 35.0,
        "loss": 11.0,
        "stand_ins": ["attention: PyTorch SDPA shim"],
    }
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_doc("speed", speed)))
    b.write_text(json.dumps(_doc("mdlm_ref", ref, "2026-11-24T10:20:00+00:00")))
    doc = merge([str(a), str(b)])
    assert set(doc["steps"]) == {"speed", "mdlm_ref"} and len(doc["runs"]) == 2
    md = report.render(doc)
    assert "NVIDIA H100" in md and "31.0 s, 31.0 s" in md and "kuleshov-group/mdlm" in md
    assert "replaid mdlm (eager)" in md and "41.0%" in md
    docs = tmp_path / "benchmarks.md"
    docs.write_text(f"# B\n\nbefore\n{BEGIN}\nNo GPU measured yet.\n{END}\nafter\n")
    record(md, docs)
    text = docs.read_text()
    assert "No GPU measured yet" not in text and "before" in text and "after" in text and "kuleshov-group" in text
    record("again", docs)  # idempotent: the block is replaced, not appended
    assert docs.read_text().count(BEGIN) == 1 and "kuleshov-group" not in docs.read_text()


@pytest.mark.parametrize("name", ["gpu_check", "h200-2026-11-26"])
def test_the_committed_records_render_as_committed(name):
    """The committed JSON renders to the committed markdown byte for byte (the renderers' output is fixed)."""
    folder = REPO / "docs" / "gpu_check"
    assert report.render(json.loads((folder / f"{name}.json").read_text())) == (folder / f"{name}.md").read_text()


def test_every_step_has_its_renderer():
    """One renderer per step (the compiled speed is a mode of the speed table)."""
    assert {name for name, _ in report.RENDERERS} | {"speed_compiled"} == set(plan.STEP_NAMES)


def test_the_check_imports_no_private_name_of_the_library():
    """The GPU check uses replaid's public API only (the dry run resolved a command line with the
    private ``replaid.cli._parser`` before ``replaid.cli.parse``)."""
    import ast

    bad = []
    for f in sorted((REPO / "benchmarks" / "gpu_check").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("replaid"):
                bad += [f"{f.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert not bad, bad


def test_docs_hold_the_gpu_check_block():
    text = (REPO / "docs" / "benchmarks.md").read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert "scripts/gpu_check.sh" in (REPO / "docs" / "guides" / "scaling.md").read_text()  # the README's guide


def test_the_syncs_child_builds_every_method_on_cpu():
    """The syncs step's configs and trainers, run on the CPU (nothing counted there): its overrides
    must be ones each method reads (on the H200 on 2026-11-26 it failed for MDLM on a RePlaid-only key)."""
    out = children.child_syncs(list(base.ALL_METHODS), steps=1, device="cpu", allow_cpu=True)
    assert set(out["methods"]) == set(base.ALL_METHODS)


def test_the_mdlm_sampler_benchmark_runs_on_cpu():
    """bench_sample.py --method mdlm times the registry's sampler (it called a removed method.sample)."""
    r = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_sample.py",
            "--preset",
            "debug",
            "--method",
            "mdlm",
            "--steps",
            "4",
            "--batch",
            "2",
            "--device",
            "cpu",
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert row["method"] == "mdlm" and 1 <= row["nfe"] <= 4


@pytest.mark.parametrize("name", ["blocks", "blocks_01b"])
def test_the_blocks_step_runs_reads_and_renders_bench_blocks_on_cpu(tmp_path, name):
    """The blocks steps (issue 39 §4 on a lent GPU: demo size in --quick, owt-0.1b in the full check) end to
    end on a CPU with --tiny: bench_blocks.py's last JSON line is read into the step's result and rendered
    as the block-diffusion table."""
    out = tmp_path / "out"
    assert cli.main(["--tiny", "--device", "cpu", "--steps", name, "--out", str(out)]) == 0
    doc = json.loads((out / "gpu_check.json").read_text())
    step = doc["steps"][name]
    assert step["status"] == "ok", step
    data = step["results"][0]["data"]
    assert data["ok"] and not data["problems"] and data["meta"]["device"].startswith("CPU")
    families = {r["family"] for r in data["rows"]}
    assert families == {"ar", "blocks", "full"} and all(r["tokens_per_s"] > 0 for r in data["rows"])
    md = (out / "gpu_check.md").read_text()
    assert "**block diffusion**" in md and f"| {name} | ok |" in md
    assert md.count("| blocks | mdlm |") == sum(r["family"] == "blocks" and r["method"] == "mdlm" for r in data["rows"])


def test_the_breakdown_step_runs_reads_and_renders_on_cpu(tmp_path):
    """Issue 53 §1 on a lent GPU: the breakdown step end to end on a CPU with --tiny: bench_breakdown.py's last
    JSON line (every method's phases and named regions, the bytes model) is read and rendered."""
    out = tmp_path / "out"
    assert cli.main(["--tiny", "--device", "cpu", "--steps", "breakdown", "--out", str(out)]) == 0
    step = json.loads((out / "gpu_check.json").read_text())["steps"]["breakdown"]
    assert step["status"] == "ok", step
    data = step["results"][0]["data"]
    parts = {(r["method"], r["part"].strip()) for r in data["rows"]}
    for m in ("ar", "mdlm", "replaid"):
        assert {(m, p) for p in ("data", "forward", "backward", "optimiser", "step")} <= parts, parts
    assert ("replaid", "self-conditioning pass") in parts and ("replaid", "output prior logits") in parts
    assert ("mdlm", "per-element loss") in parts and ("replaid", "_PriorSoftmaxHeadBackward") in parts
    assert data["bytes_model"]["replaid_head"]["seconds"] > 0
    md = (out / "gpu_check.md").read_text()
    assert "**step breakdown**" in md and "| breakdown | ok |" in md and "bytes model replaid_head" in md


@pytest.mark.slow
def test_the_serve_step_trains_loads_and_renders_on_cpu(tmp_path):
    """Issue 52 §3 on a lent GPU: the serve step end to end on a CPU with --tiny: three runs trained (AR, MDLM
    and RePlaid with blocks of 4), each served under 1 and 4 streaming clients through load_serve.py, the
    clients' and the server's access log's figures read into the step's result and rendered."""
    out = tmp_path / "out"
    assert cli.main(["--tiny", "--device", "cpu", "--steps", "serve", "--out", str(out)]) == 0
    step = json.loads((out / "gpu_check.json").read_text())["steps"]["serve"]
    assert step["status"] == "ok", step
    rows = step["results"][0]["data"]["rows"]
    assert {(r["run"], r["clients"]) for r in rows} == {(n, c) for n in ("ar", "mdlm-b4", "replaid-b4") for c in (1, 4)}
    for r in rows:
        assert "error" not in r and r["ok"] == r["clients"] and r["refused_429"] == 0, r
        assert r["tokens_per_s"] > 0 and 0 < r["log_ttft_p50_s"] and r["block"] == (1 if r["run"] == "ar" else 4)
    md = (out / "gpu_check.md").read_text()
    assert "**served completions under load**" in md and "| serve | ok |" in md


def _bf16_grid(root: Path, bounds: dict[str, list[float]], nan_at: tuple[str, int] | None = None) -> Path:
    """A grid folder of the bf16_train step's shape: runs/<cell>__s<seed>/metrics.jsonl with training rows
    every 10 steps (a NaN gradient at ``nan_at``) and evaluations at steps 20 and 40."""
    import math

    for cell, vals in bounds.items():
        for seed, b in enumerate(vals):
            run = root / "runs" / f"{cell}__s{seed}"
            run.mkdir(parents=True)
            rows = []
            for step in range(10, 50, 10):
                bad = nan_at == (f"{cell}__s{seed}", step)
                g = math.nan if bad else 0.5 + step / 100 + seed
                rows.append(
                    {"step": step, "loss": 6.0, "grad_norm": g, "grad_norm/endpoints": g / 4, "skipped": int(bad)}
                )
                if step in (20, 40):
                    rows.append({"step": step, "eval/nelbo_nats_per_token": b + (40 - step) / 100})
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_bf16_train_summary_against_scipy_and_planted_faults(tmp_path):
    """benchmarks/bf16_runs.py's verdict (issue 53 §3): the fp32 seed interval and the paired difference
    equal scipy's t-intervals; a bf16 bound outside the interval, or a non-finite step, turns it to not ok."""
    import numpy as np
    from scipy import stats

    sys.path.insert(0, str(REPO / "benchmarks"))
    import bf16_runs

    fp32, bf16 = [6.10, 6.20, 6.15], [6.12, 6.18, 6.16]
    s = bf16_runs.summarise(_bf16_grid(tmp_path / "a", {"fp32": fp32, "bf16": bf16}))
    lo, hi = stats.t.interval(0.95, 2, loc=np.mean(fp32), scale=stats.sem(fp32))
    assert s["step"] == 40 and s["ok"] and not s["diverged"]
    assert s["reference_interval"]["lo"] == pytest.approx(lo) and s["reference_interval"]["hi"] == pytest.approx(hi)
    d = np.subtract(bf16, fp32)
    dlo, dhi = stats.t.interval(0.95, 2, loc=d.mean(), scale=stats.sem(d))
    assert s["paired"]["diff_lo"] == pytest.approx(dlo) and s["paired"]["diff_hi"] == pytest.approx(dhi)
    assert s["runs"]["bf16__s1"]["max_grad_norm"] == pytest.approx(0.5 + 0.4 + 1)
    assert s["runs"]["bf16__s1"]["max_grad_norm_endpoints_step"] == 40  # the largest, with its step
    assert s["runs"]["bf16__s1"]["plateau_exit_step"] is None  # rows without their tokens' unigram NLL
    assert s["runs"]["bf16__s1"]["bounds"] == {"20": pytest.approx(6.38), "40": pytest.approx(6.18)}

    out = bf16_runs.summarise(_bf16_grid(tmp_path / "b", {"fp32": fp32, "bf16": [6.12, 6.60, 6.16]}))
    assert not out["ok"] and out["inside_reference_interval"] == {"0": True, "1": False, "2": True}

    # fp32 runs from another grid (a CPU screen's default cell): the same verdict, read across grids
    _bf16_grid(tmp_path / "r", {"replaid": fp32, "other": [9.0, 9.0, 9.0]})
    _bf16_grid(tmp_path / "x", {"bf16": bf16})
    across = bf16_runs.summarise(tmp_path / "x", "replaid", reference_grid=tmp_path / "r")
    assert (
        across["ok"] and across["reference_interval"] == s["reference_interval"] and "other__s0" not in across["runs"]
    )

    bad = bf16_runs.summarise(_bf16_grid(tmp_path / "c", {"fp32": fp32, "bf16": bf16}, nan_at=("bf16__s2", 30)))
    assert not bad["ok"] and bad["diverged"] == ["bf16__s2"] and bad["runs"]["bf16__s2"]["first_nonfinite_step"] == 30
    assert bad["runs"]["bf16__s2"]["max_grad_norm"] == pytest.approx(0.5 + 0.4 + 2)  # the NaN row left out


@pytest.mark.slow
def test_the_bf16_train_step_runs_and_renders_on_cpu(tmp_path):
    """The bf16_train step (full check only) end to end on a CPU with --tiny: six short runs planned from
    docs/results/trend/bf16.yaml, run, summarised and rendered as the bf16-against-fp32 table."""
    out = tmp_path / "out"
    assert cli.main(["--tiny", "--device", "cpu", "--steps", "bf16_train", "--out", str(out)]) == 0
    step = json.loads((out / "gpu_check.json").read_text())["steps"]["bf16_train"]
    assert step["status"] == "ok", step
    data = step["results"][0]["data"]
    assert sorted(data["runs"]) == [f"{c}__s{s}" for c in ("bf16", "fp32") for s in range(3)]
    assert all(r["finished"] for r in data["runs"].values()) and data["ok"]
    md = (out / "gpu_check.md").read_text()
    assert "**RePlaid bf16 against fp32 over whole runs**" in md and md.count("| bf16__s") == 3


def test_plateau_b512_summary_reads_exits_in_steps_and_tokens_and_keeps_logs_not_checkpoints(tmp_path):
    """benchmarks/plateau_b512.py (issue 48 §2): each run's exit is the first logged step from which the
    training bound stays 0.3 nats below its tokens' unigram NLL, in tokens times batch x L; a run that dips
    below and returns, or never leaves, has none; keep_logs copies logs and the plan, never checkpoints."""
    import device_grid
    import plateau_b512

    from replaid.presets import resolve

    grid = tmp_path / "grid"
    # (bound per logged step 10..60) against a unigram of 6.0: exits at 40; a dip at 20 that returns, then 50; none
    curves = {"mdlm__s0": [5.9, 5.8, 5.75, 5.6, 5.5, 5.4], "cooc__s0": [5.9, 5.6, 5.8, 5.8, 5.65, 5.5],
              "replaid__s0": [5.9, 5.9, 5.85, 5.8, 5.8, 5.75]}  # fmt: skip
    for name, bounds in curves.items():
        run = grid / "runs" / name
        (run / "checkpoints" / "step_0000060").mkdir(parents=True)
        (run / "checkpoints" / "step_0000060" / "model.safetensors").write_bytes(b"x")
        cfg = resolve("debug", None, ["train.batch_size=512", "data.seq_len=64"])
        (run / "config.json").write_text(json.dumps(cfg.to_dict()))
        rows = [{"step": 10 * (i + 1), "loss": b, "unigram": 6.0} for i, b in enumerate(bounds)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        if name != "replaid__s0":
            (run / "final_eval.json").write_text(
                json.dumps({"step": 60, "eval": {"nelbo_nats_per_token": bounds[-1] - 0.1}})
            )
    (grid / "spec.json").write_text("{}")
    s = plateau_b512.summarise(grid)
    assert s["cells"] == {"mdlm": {"0": 40}, "cooc": {"0": 50}, "replaid": {"0": None}}
    assert s["runs"]["mdlm__s0"]["exit_tokens"] == 40 * 512 * 64 and s["runs"]["mdlm__s0"]["batch"] == 512
    assert s["runs"]["mdlm__s0"]["bound"] == pytest.approx(5.3) and s["runs"]["replaid__s0"]["bound"] is None
    assert s["runs"]["replaid__s0"]["last_step"] == 60 and not s["finished"]
    kept = device_grid.keep_logs(grid, tmp_path / "kept")
    assert (kept / "spec.json").is_file() and not list(kept.rglob("checkpoints"))
    assert sorted(p.name for p in (kept / "runs" / "mdlm__s0").iterdir()) == sorted(device_grid.LOGS)
    assert plateau_b512.summarise(kept)["cells"] == s["cells"]  # the kept copy reads as the grid does


@pytest.mark.slow
def test_the_plateau_b512_step_runs_keeps_and_renders_on_cpu(tmp_path):
    """The plateau_b512 step (full check only) end to end on a CPU with --tiny: nine short runs planned from
    docs/results/plateau/arms-b512.yaml, run, summarised, their logs kept under the check's --out, rendered."""
    out = tmp_path / "out"
    assert cli.main(["--tiny", "--device", "cpu", "--steps", "plateau_b512", "--out", str(out)]) == 0
    step = json.loads((out / "gpu_check.json").read_text())["steps"]["plateau_b512"]
    assert step["status"] == "ok", step
    data = step["results"][0]["data"]
    assert sorted(data["runs"]) == [f"{c}__s{s}" for c in ("cooc", "mdlm", "replaid") for s in range(3)]
    assert data["finished"] and data["kept"] == str(out / "plateau_b512")
    assert all(isinstance(r["bound"], float) for r in data["runs"].values())  # read from the real final_eval.json
    assert len(list((out / "plateau_b512" / "runs").glob("*/metrics.jsonl"))) == 9
    md = (out / "gpu_check.md").read_text()
    assert "**The plateau's exit at batch 512**" in md and md.count("| mdlm__s") == 3
