"""Issue 49, class "code executed": one quoting rule for every generated script (scaling/launch.py).

Every option whose value goes into a generated job script (``replaid train --nodes``'s sbatch script,
the torchrun command line it builds, the submitit parameters and folder of ``grid run`` /
``scaling run --executor slurm``) is fed values holding a newline, ``;``, ``$(...)`` and a backquote.
Each is either refused in one line (exit 2, nothing written) or lands in the script as one quoted
word: the script has exactly the lines of a clean one, and run under bash (with ``srun``, ``scontrol``
and ``sbatch`` replaced by recorders) it runs exactly the intended commands, with the value as one
argument, and nothing else (no marker file appears).
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from replaid.cli import main
from replaid.scaling import launch

MARK = "PWNED"  # every hostile value tries to create this file in the script's working folder
HOSTILE = {
    "newline": f"gpu\ntouch {MARK}",
    "carriage return": f"gpu\rtouch {MARK}",
    "semicolon": f"gpu;touch {MARK}",
    "command substitution": f"$(touch {MARK})",
    "backquote": f"`touch {MARK}`",
    "all of them": f"a'b\"c; touch {MARK}\n$(touch {MARK}) `touch {MARK}` && touch {MARK}",
}


def recorders(bin_dir: Path) -> None:
    """``srun`` and ``sbatch`` that record their argv (NUL-separated), ``scontrol`` that names a host."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    scripts = {
        "srun": 'printf "%s\\0" "$@" > "$REC"\n',
        "scontrol": "echo node01\n",
        "sbatch": 'cp "$1" "$REC.script"\necho "Submitted batch job 4242"\n',
    }
    for name, body in scripts.items():
        p = bin_dir / name
        p.write_text("#!/bin/bash\n" + body)
        p.chmod(p.stat().st_mode | stat.S_IEXEC)


def run_script(script: str, work: Path) -> list[str]:
    """Run ``script`` under bash in ``work`` with the recorders first on PATH; srun's argv."""
    recorders(work / "bin")
    rec = work / "srun.argv"
    env = {**os.environ, "PATH": f"{work / 'bin'}:{os.environ['PATH']}", "REC": str(rec), "SLURM_JOB_NODELIST": "n1"}
    r = subprocess.run(["bash", "-c", script, "job"], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return rec.read_bytes().decode().split("\0")[:-1]


def one_line_refusal(capsys, rc: int) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("replaid: error: "), err
    return err[0]


def train_nodes(tmp_path: Path, capsys, option: str, value: str):
    """``replaid train --nodes 2 --gpus-per-node 2 --dry-run`` with ``value`` given to ``option``;
    (rc, the script, the expected train argv)."""
    out = str(tmp_path / "run")
    preset, config, slurm, overrides = "debug", None, ["--partition=gpu"], ["train.steps=5"]
    if option == "--out":
        out = str(tmp_path / value)
    elif option == "--preset":
        preset = value
    elif option == "--config":
        cfg = tmp_path / f"c{value}.yaml"  # a file name may hold all of these (not a NUL)
        cfg.write_text("train:\n  steps: 5\n")
        config = str(cfg)
    elif option == "--slurm":
        slurm = [f"--partition={value}", value]
    elif option == "override":
        overrides = ["train.steps=5", f"data.source={value}"]
    argv = ["train", "--out", out, "--preset", preset, *(["--config", config] if config else [])]
    argv += ["--nodes", "2", "--gpus-per-node", "2", "--dry-run", *(f"--slurm={s}" for s in slurm), *overrides]
    capsys.readouterr()
    rc = main(argv)
    script = capsys.readouterr().out if rc == 0 else ""
    want = ["train", "--out", out, "--preset", preset, *(["--config", config] if config else [])]
    return rc, script, [*want, "--no-progress", *overrides], out


OPTIONS = ["--out", "--preset", "--config", "--slurm", "override"]


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("option", OPTIONS)
def test_train_nodes_script_holds_exactly_the_intended_commands(tmp_path, capsys, monkeypatch, option, kind):
    value = HOSTILE[kind]
    clean_rc, clean, _, _ = train_nodes(tmp_path / "clean", capsys, "override", "data")
    assert clean_rc == 0
    rc, script, want, out = train_nodes(tmp_path, capsys, option, value)
    if rc != 0:
        line = one_line_refusal(capsys, rc)
        assert option in line or "override" == option or "--preset" == option or "control character" in line
        assert not (tmp_path / MARK).exists()
        return
    body = script.split("\n# node 0 runs: ")[0]
    clean_body = clean.split("\n# node 0 runs: ")[0]
    # no value adds or removes a line: the script has the clean script's lines, in the same places
    assert len(body.splitlines()) == len(clean_body.splitlines())
    for a, b in zip(body.splitlines(), clean_body.splitlines(), strict=True):
        if a.startswith("#SBATCH"):
            assert b.startswith("#SBATCH") and len(shlex.split(a, comments=True)) == 0  # a comment to bash
            assert len(a.split()) == 2  # one option a line (sbatch reads these, not bash)
    # each shell line parses (shlex) into the same number of words as the clean one, but for the run arrays
    for a, b in zip(body.splitlines(), clean_body.splitlines(), strict=True):
        if not a.startswith("if [ -f"):
            assert len(shlex.split(a, comments=True)) == len(shlex.split(b, comments=True)), a
    bash = subprocess.run(["bash", "-n"], input=body, text=True, capture_output=True)
    assert bash.returncode == 0, bash.stderr
    work = tmp_path / "work"
    work.mkdir()
    argv = run_script(body, work)
    assert argv == ["--kill-on-bad-exit=1", sys.executable, "-m", "replaid.scaling.launch", "--nodes", "2", "--gpus-per-node", "2", "--exec",
                    *want]  # fmt: skip
    assert sorted(p.name for p in work.iterdir()) == ["bin", "srun.argv"]  # nothing else ran
    assert not (tmp_path / MARK).exists() and not Path(MARK).exists()
    # the node-0 line printed by --dry-run is one shell command too
    node0 = shlex.split(script.split("\n# node 0 runs: ")[1])
    assert node0[node0.index("train") :] == want


def test_train_nodes_submits_the_same_script_to_sbatch(tmp_path, capsys, monkeypatch):
    """Without --dry-run the script written beside --out is the one checked above (sbatch recorder)."""
    recorders(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("REC", str(tmp_path / "sbatch"))
    out = tmp_path / "run"
    value = HOSTILE["all of them"].replace("\n", " ")  # a newline is refused (the test above)
    rc = main(["train", "--out", str(out), "--preset", "debug", "--nodes", "2", "--gpus-per-node", "2",
               f"data.source={value}"])  # fmt: skip
    assert rc == 0
    script = (tmp_path / "sbatch.script").read_text()
    work = tmp_path / "work"
    work.mkdir()
    argv = run_script(script, work)
    assert argv[argv.index("--exec") + 1 :] == ["train", "--out", str(out), "--preset", "debug", "--no-progress",
                                               f"data.source={value}"]  # fmt: skip
    assert sorted(p.name for p in work.iterdir()) == ["bin", "srun.argv"]


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_sbatch_script_refuses_or_quotes_every_value(kind):
    """The library function itself (every argument a caller can give it)."""
    value = HOSTILE[kind]
    for kw in ({"out": value}, {"python": value}, {"train_args": ["x", value]}, {"extra": [value]},
               {"job_name": value}):  # fmt: skip
        args = {"out": "o", "train_args": ["--preset", "debug"], "python": "python", **kw}
        try:
            s = launch.sbatch_script(args.pop("out"), args.pop("train_args"), 2, 2, **args)
        except launch.ConfigError:
            continue
        assert len(s.splitlines()) == len(launch.sbatch_script("o", ["--preset", "debug"], 2, 2).splitlines())
        assert kw.keys() <= {"out", "python", "train_args"}  # #SBATCH options and the job name are refused
        assert "\n" not in value and "\r" not in value  # a control character is never accepted


# --- grid run / scaling run --executor slurm: the submitit parameters ------------------------------


def plan(tmp_path: Path) -> Path:
    from replaid.scaling import plan as sc

    sweep = tmp_path / "sw"
    debug = ["data.max_docs=200", "data.bpe_vocab_size=300", "data.seq_len=16", "train.steps=2"]
    sc.write_plan(sc.make_plan(["ar"], [2e8], "32x1", per_budget=0, overrides=debug), sweep)
    return sweep


PARAMS = [
    ("slurm_partition={v}", "partition"),
    ("slurm_comment={v}", "comment"),
    ('slurm_additional_parameters={{"mail-user": {j}}}', "additional value"),
    ('slurm_additional_parameters={{{j}: "x"}}', "additional key"),
    ('slurm_setup=["echo {v}"]', "setup"),
    ('slurm_srun_args=["{v}"]', "srun_args"),
    ("{v}=1", "key"),
]


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("param", [p for p, _ in PARAMS], ids=[i for _, i in PARAMS])
def test_submitit_parameters_hold_exactly_the_intended_commands(tmp_path, capsys, monkeypatch, param, kind):
    pytest.importorskip("submitit")
    import json

    value = HOSTILE[kind]
    sweep = plan(tmp_path)
    recorders(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("REC", str(tmp_path / "sbatch"))
    arg = param.format(v=value, j=json.dumps(value))
    capsys.readouterr()
    rc = main(["scaling", "run", str(sweep), "--executor", "slurm", "--no-wait", "--slurm", arg])
    if rc != 0:
        one_line_refusal(capsys, rc)
        assert not (tmp_path / "sbatch.script").exists()  # nothing submitted
        return
    assert "setup" not in param and "srun_args" not in param  # shell lines by design: always refused
    script = (tmp_path / "sbatch.script").read_text()
    assert "\n" not in value and "\r" not in value
    # each #SBATCH line holds one option; the shell lines are submitit's own
    shell = [x for x in script.splitlines() if x.strip() and not x.startswith("#")]
    assert shell[0] == "export SUBMITIT_EXECUTOR=slurm" and shell[1].startswith("srun ") and len(shell) == 2
    work = tmp_path / "work"
    work.mkdir()
    argv = run_script(script, work)
    assert argv[0] == "--unbuffered" and argv[-3:-1] == ["-m", "submitit.core._submit"]
    assert sorted(p.name for p in work.iterdir()) == ["bin", "srun.argv"]


@pytest.mark.parametrize("kind", ["newline", "carriage return"])
def test_a_sweep_folder_with_a_control_character_is_refused_for_slurm(tmp_path, capsys, monkeypatch, kind):
    pytest.importorskip("submitit")
    recorders(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("REC", str(tmp_path / "sbatch"))
    sweep = plan(tmp_path)
    odd = tmp_path / HOSTILE[kind]
    odd.parent.mkdir(parents=True, exist_ok=True)
    sweep.rename(odd)
    capsys.readouterr()
    rc = main(["scaling", "run", str(odd), "--executor", "slurm", "--no-wait"])
    assert "control character" in one_line_refusal(capsys, rc)
    assert not (tmp_path / "sbatch.script").exists()


def test_the_node_launcher_execs_torchrun_with_the_arguments_as_given(monkeypatch):
    """``python -m replaid.scaling.launch ... --exec ARGS`` (the script's srun task): torchrun's argv
    then ARGS, each one argument, no shell in between."""
    got = {}

    def execv(path, argv):
        got["argv"] = argv
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", execv)
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_ID": "7"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    value = HOSTILE["all of them"]
    with pytest.raises(SystemExit):
        launch.main(["--nodes", "2", "--gpus-per-node", "2", "--exec", "train", "--out", value])
    assert got["argv"][:-3] == launch.torchrun_argv(2, 2, env, (sys.executable, "-m", "torch.distributed.run"))
    assert got["argv"][-3:] == ["train", "--out", value]
