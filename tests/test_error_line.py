"""Issue 36 §4: a command that fails while a progress bar is drawn ends stderr with its one
``replaid: error:`` line, on a line of its own; no bar text shares that line or follows it.

Each case runs the real CLI in a child process (stderr a pipe: tqdm draws there all the same), with a
fault injected into the middle of the bar: a full disk at the step-5 checkpoint of ``train``, a full
disk at a forward pass of ``sample`` (MDLM: in its second batch), an estimator that fails half-way in
``likelihood``."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from replaid.eval.evaluate import evaluate
from replaid.presets import resolve
from replaid.training.train import train

REPO = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import errno, sys
    from replaid.cli import main

    FULL = OSError(errno.ENOSPC, "No space left on device")
    kind = sys.argv[1]
    if kind == "train":  # the disk fills up at the step-5 checkpoint, inside the run folder only
        from replaid.store import checkpoint as ck
        real_save = ck.save_file
        def save_file(tensors, path, *a, **k):
            if "step_0000005" in path:
                raise FULL
            return real_save(tensors, path, *a, **k)
        ck.save_file = save_file
    elif kind == "sample":  # forward pass number argv[2] of the sampler fails
        from replaid.store import loading
        real_load, calls = loading.load_run, [0]
        def load_run(*a, **k):
            run = real_load(*a, **k)
            def hook(module, inputs):
                calls[0] += 1
                if calls[0] == int(sys.argv[2]):
                    raise FULL
            run.model.register_forward_pre_hook(hook)
            return run
        loading.load_run = load_run
    elif kind == "likelihood":  # the estimator advances the bar, then fails
        from replaid.eval import likelihood
        def estimate_likelihood(*a, progress, **k):
            progress(1.0, 4)
            progress(2.0, 4)
            raise ValueError("the ODE solver failed half-way (injected)")
        likelihood.estimate_likelihood = estimate_likelihood
    sys.exit(main(sys.argv[3 if kind == "sample" else 2 :]))
    """
)


def run_cli(kind: str, *argv: str) -> tuple[int, str]:
    """(exit status, stderr as written: bytes decoded, no newline translation, so each '\\r' is kept)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    env.pop("REPLAID_DEBUG", None)
    p = subprocess.run([sys.executable, "-c", CHILD, kind, *argv], capture_output=True, env=env, timeout=300)
    return p.returncode, p.stderr.decode("utf-8", "replace")


def assert_error_is_the_last_line(p: tuple[int, str], bar: str, what: str) -> None:
    code, err = p
    assert code == 2, err[-2000:]
    assert bar in err, f"the bar ({bar!r}) was never drawn, so this case tests nothing:\n{err}"
    lines = err.replace("\r", "\n").rstrip("\n").split("\n")  # a '\r' redraw starts a line too
    assert lines[-1].startswith("replaid: error: "), f"last line of stderr: {lines[-1]!r}"
    assert what in lines[-1], lines[-1]
    assert err.count("replaid: error:") == 1
    before, after = err.split("replaid: error:")
    assert after.endswith("\n") and after.count("\n") == 1 and "\r" not in after, repr(err[-300:])
    # the error starts a line: after a '\n', or after a bar that erased itself ('\r', blanks, '\r': an
    # inner bar with leave=False closes so when the exception unwinds its loop, before any handler runs)
    erased = before.endswith("\r") and not before.rstrip("\r").rsplit("\r", 1)[-1].strip()
    assert before == "" or before.endswith("\n") or erased, f"the error shares the bar's line: {before[-200:]!r}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Two-step debug runs: RePlaid (continuous) and MDLM (discrete: an outer per-sample bar)."""
    out = {}
    for method in ("replaid", "mdlm"):
        run = out[method] = tmp_path_factory.mktemp("errline") / method
        over = [f"method={method}", "train.steps=2", "eval.max_batches=1", "train.num_threads=1"]
        train(resolve("debug", None, over), run, evaluate=evaluate, progress=False)
    return out


def test_a_full_disk_in_train_ends_stderr_with_the_error_line_alone(tmp_path):
    out = tmp_path / "run"
    p = run_cli(
        "train",
        "train",
        "--preset",
        "debug",
        "--out",
        str(out),
        "train.steps=10",
        "train.save_every=5",
        "train.log_every=1",
        "train.num_threads=1",
        "train.eval_every=0",
        "eval.max_batches=1",
    )
    assert_error_is_the_last_line(p, "train:", "could not write checkpoint step_0000005")
    assert "No space left on device" in p[1].splitlines()[-1]
    assert not (out / "checkpoints" / "step_0000005").exists()


def test_a_failure_while_sampling_ends_stderr_with_the_error_line_alone(runs):
    """MDLM, 4 samples 2 at a time, 8 steps: the 10th forward pass (batch 2) fails under the sampler's
    per-step bar (every sampler draws its own since the one sampler contract, issue 35)."""
    p = run_cli("sample", "10", "sample", str(runs["mdlm"]), "--num", "4", "--batch-size", "2", "--steps", "8")
    assert_error_is_the_last_line(p, "mdlm:", "No space left on device")


def test_a_failure_in_likelihood_ends_stderr_with_the_error_line_alone(runs, tmp_path):
    p = run_cli(
        "likelihood",
        "likelihood",
        str(runs["replaid"]),
        "--out",
        str(tmp_path / "lik"),
        "--num-seqs",
        "2",
        "--K",
        "2",
        "--steps",
        "4",
    )
    assert_error_is_the_last_line(p, "ODE log-weights", "the ODE solver failed half-way")
