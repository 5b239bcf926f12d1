"""The package as users get it (issue 37 §1): ``python -m build`` makes an sdist and a wheel (the wheel
built from the sdist, so a file missing from the sdist fails here), ``twine check --strict`` passes, and
the wheel, installed into a new venv outside the repository and run from a folder outside it, trains,
evaluates, samples, exports, serves its page and answers ``lm_eval --model replaid``, with no
``PYTHONPATH`` and no repository beside it.

The venv's third-party packages. Installing the wheel's dependencies from scratch (torch, transformers,
datasets, lm-eval, ...) takes minutes and needs a package index; here the venv gets the wheel alone
(``pip install --no-deps``) and one ``.pth`` line naming the test interpreter's site-packages folder, so
it imports the same torch, lm-eval, FastAPI... A plain path in a ``.pth`` is appended to ``sys.path``
without reading the ``.pth`` files in it, so neither the editable install's path to ``src/`` nor the
repository's ``replaid_lmeval.pth`` take effect, and the venv's own site-packages (the wheel's
``replaid`` and ``replaid_lmeval.pth``) come first; every run checks where ``replaid`` was imported
from. What this does not check: that pip resolves the wheel's declared dependencies. With
``REPLAID_WHEEL_TEST_DEPS=index`` the venv installs them instead (``pip install WHEEL[web,lmeval]``,
torch pinned by scripts/constraints.txt; minutes, needs the index).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
STATIC = ("index.html", "app.js", "style.css")


def _run(argv, cwd, env, timeout=600, ok=True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if ok:
        assert r.returncode == 0, f"{argv}\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-4000:]}"
    return r


def _source_tree(dst: Path) -> Path:
    """The files a clone would have (tracked, and new files git does not ignore), copied: building in the
    checkout itself would write src/replaid.egg-info beside the editable install's package."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True
    )
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    for rel in filter(None, listed.stdout.decode().split("\0")):
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    return dst


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """``python -m build`` (sdist, then the wheel from the sdist), with the test interpreter's setuptools."""
    for mod in ("build", "twine"):
        if subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True).returncode != 0:
            pytest.fail(f"the '{mod}' package is missing: it is in the dev extra (bash scripts/setup.sh)")
    tmp = tmp_path_factory.mktemp("wheel-build")
    tree = _source_tree(tmp / "tree")
    out = tmp / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, tree], cwd=tmp, env=os.environ)
    _run([sys.executable, "-m", "twine", "check", "--strict", *sorted(out.iterdir())], cwd=tmp, env=os.environ)
    return out


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory):
    """A new venv holding the wheel (see the module's docstring), the environment its commands run in, and
    a working folder outside the repository."""
    import replaid

    tmp = tmp_path_factory.mktemp("wheel-venv")
    root = tmp / "venv"
    wheel = next(dist.glob("replaid-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", root], check=True)
    py = root / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, None).stdout.strip())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    pip = [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--disable-pip-version-check"]
    if os.environ.get("REPLAID_WHEEL_TEST_DEPS") == "index":
        _run([*pip, "-c", REPO / "scripts" / "constraints.txt", f"{wheel}[web,lmeval]"], tmp, env, 1800)
    else:
        _run([*pip, "--no-deps", "--no-index", wheel], tmp, env)
        outer = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
        (site / "_outer_site_packages.pth").write_text("".join(f"{p}\n" for p in outer))
    assert (site / "replaid" / "__init__.py").is_file() and (site / "replaid_lmeval.pth").is_file()
    env.update(
        PATH=f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        OMP_NUM_THREADS="1",
        REPLAID_CACHE_DIR=str(tmp / "cache"),
        HF_HOME=str(tmp / "hf"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
    )
    work = tmp / "work"
    work.mkdir()
    assert REPO not in work.resolve().parents
    probe = "import json, sys, replaid; print(json.dumps([replaid.__file__, sys.path]))"
    where, path = json.loads(_run([py, "-c", probe], work, env).stdout)
    assert not {str(REPO), str(REPO / "src")} & {str(Path(p or work).resolve()) for p in path}, path
    assert Path(where).resolve().is_relative_to(site.resolve()), f"replaid imported from {where}, not the wheel"
    assert Path(where).resolve() != Path(replaid.__file__).resolve()
    return root, env, work


def test_the_wheel_holds_the_package_its_data_and_the_lmeval_hook(dist):
    wheel = next(dist.glob("replaid-*.whl"))
    sdist = next(dist.glob("replaid-*.tar.gz"))
    names = set(zipfile.ZipFile(wheel).namelist())
    from replaid import __version__

    assert wheel.name == f"replaid-{__version__}-py3-none-any.whl" and sdist.name == f"replaid-{__version__}.tar.gz"
    assert {f"replaid/web/static/{f}" for f in STATIC} <= names
    assert {"replaid/__init__.py", "replaid/cli.py", "replaid/hub/modeling_replaid.py", "replaid_lmeval.pth"} <= names
    from replaid._lmeval_pth import LINE

    assert zipfile.ZipFile(wheel).read("replaid_lmeval.pth").decode() == LINE
    tops = {n.split("/")[0] for n in names}
    assert tops == {"replaid", "replaid_lmeval.pth", f"replaid-{__version__}.dist-info"}, tops
    py_files = {str(p.relative_to(REPO / "src")) for p in (REPO / "src" / "replaid").rglob("*.py")}
    assert py_files <= names, sorted(py_files - names)
    assert wheel.stat().st_size < 1_000_000


def test_the_installed_wheel_trains_evaluates_samples_and_exports(venv):
    root, env, work = venv
    replaid = root / "bin" / "replaid"
    run = work / "runs" / "debug"
    _run([replaid, "train", "--preset", "debug", "--out", run, "--no-progress", "train.num_threads=1"], work, env)
    assert (run / "config.json").is_file() and (run / "final_eval.json").is_file()
    ev = json.loads(_run([replaid, "eval", run, "--json"], work, env).stdout)
    assert ev["nelbo_ppl"] > 1
    out = _run([replaid, "sample", run, "--steps", "4", "--num", "2", "--seed", "0", "--json"], work, env).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(rows) == 2 and all(isinstance(r["text"], str) for r in rows)
    _run([replaid, "export", run, "--out", work / "export"], work, env)
    exported = {p.name for p in (work / "export").iterdir()}
    assert {"config.json", "modeling_replaid.py"} <= exported, exported
    _run([replaid, "eval", work / "export", "--json"], work, env)  # the exported folder loads again


def test_the_installed_wheel_serves_its_page(venv):
    root, env, work = venv
    run = _trained(root, env, work)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [root / "bin" / "replaid", "serve", run, "--port", port, "--threads", "1"]
    srv = subprocess.Popen([str(a) for a in argv], cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while True:
            assert srv.poll() is None, srv.stderr.read().decode()[-3000:] if srv.stderr else "serve exited"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.time() < deadline, "replaid serve did not listen within 120 s"
            time.sleep(0.2)
        base = f"http://127.0.0.1:{port}"
        page = urllib.request.urlopen(f"{base}/", timeout=30).read().decode()
        assert "<html" in page.lower() and "/static/app.js" in page
        for f in STATIC:
            with urllib.request.urlopen(f"{base}/static/{f}", timeout=30) as r:
                assert r.status == 200 and r.read()
        runs = json.loads(urllib.request.urlopen(f"{base}/api/runs", timeout=30).read())
        assert runs, runs
    finally:
        srv.terminate()
        try:
            srv.wait(20)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait(10)


def test_lm_eval_knows_model_replaid_from_the_installed_wheel(venv):
    """The harness's own CLI (``python -m lm_eval``, what the ``lm_eval`` script runs) finds ``--model
    replaid`` through the wheel's ``replaid_lmeval.pth``, on a two-document local task."""
    root, env, work = venv
    run = _trained(root, env, work)
    tasks = work / "tasks"
    tasks.mkdir(exist_ok=True)
    docs = [
        {"context": "Return the value of the", "target": " key"},
        {"context": "The list holds the", "target": " keys"},
    ]
    (tasks / "tiny.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    task = {
        "task": "wheel_tiny",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(tasks / "tiny.jsonl")}},
        "test_split": "test",
        "output_type": "loglikelihood",
        "doc_to_text": "{{context}}",
        "doc_to_target": "{{target}}",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    }
    (tasks / "wheel_tiny.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in task.items()))
    argv = [root / "bin" / "python", "-m", "lm_eval", "run", "--model", "replaid", "--model_args"]
    argv += [f"run={run},mc_samples=1,progress=False", "--tasks", "wheel_tiny", "--include_path", tasks]
    argv += ["--output_path", work / "lm_eval_out"]
    r = _run(argv, work, env)
    assert "wheel_tiny" in r.stdout, r.stdout[-2000:]


def _trained(root: Path, env: dict, work: Path) -> Path:
    """The debug run of the train test (trained here when that test was deselected)."""
    run = work / "runs" / "debug"
    if not (run / "final_eval.json").is_file():
        argv = [root / "bin" / "replaid", "train", "--preset", "debug", "--out", run, "--no-progress"]
        _run([*argv, "train.num_threads=1", "--overwrite"], work, env)
    return run
