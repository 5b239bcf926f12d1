"""A method from outside the repository (issue 35): one file in a package of its own, registered through
the ``replaid.methods`` entry-point group, trained, evaluated, sampled and exported by the real CLI with
no edit to replaid; and the one-line errors of a name registered twice and of a broken plug-in.

The plug-in is ``tests/plugins/smooth_ar`` (its ``pyproject.toml`` declares the entry point). Installing it
is what pip would leave: the module and a ``.dist-info`` folder holding ``entry_points.txt``, in a
temporary folder put on the path (``PYTHONPATH`` for the CLI's processes, ``sys.path`` in process).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from replaid import registry
from replaid.cli import main
from replaid.config import ConfigError
from replaid.methods import METHODS, method_class
from replaid.presets import resolve

PLUGIN = Path(__file__).parent / "plugins" / "smooth_ar"
SRC = Path(__file__).resolve().parents[1] / "src"


def install(where: Path, dist: str, entries: dict[str, str], modules: dict[str, str] | None = None) -> Path:
    """What ``pip install`` leaves for a distribution ``dist``: its modules and a dist-info with
    ``entry_points.txt`` (``[replaid.methods]``: name = module:Class)."""
    where.mkdir(parents=True, exist_ok=True)
    for name, text in (modules or {}).items():
        (where / f"{name}.py").write_text(text)
    info = where / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entries.items())
    (info / "entry_points.txt").write_text(f"[{registry.GROUP}]\n{lines}")
    return where


def install_smooth_ar(where: Path) -> Path:
    return install(
        where, "smooth-ar", {"smooth-ar": "smooth_ar:SmoothAR"}, {"smooth_ar": (PLUGIN / "smooth_ar.py").read_text()}
    )


def cli(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(site)]), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "replaid", *args], env=env, capture_output=True, text=True, timeout=600
    )


def test_an_installed_method_package_trains_evaluates_samples_and_exports_through_the_cli(tmp_path):
    site = install_smooth_ar(tmp_path / "site")
    run, exp = tmp_path / "run", tmp_path / "exported"
    base = ["--preset", "debug", "--method", "smooth-ar", "--out", str(run), "--no-progress"]
    r = cli(site, "train", *base, "train.steps=4", "smooth.smoothing=0.1", "eval.max_batches=1")
    assert r.returncode == 0, r.stderr[-3000:]
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["method"] == "smooth-ar" and cfg["smooth"] == {"smoothing": 0.1}
    assert not {"diffusion", "ar", "duo"} & set(cfg)  # its own section only
    assert "self_conditioning" not in cfg["model"] and "time_embedding" in cfg["model"]  # the keys it reads

    r = cli(site, "eval", str(run), "--json", "--max-batches", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    ev = json.loads(r.stdout.strip().splitlines()[-1])
    assert 0 < ev["nll_nats_per_token"] < 20, ev

    r = cli(site, "sample", str(run), "--num", "2", "--length", "8", "--seed", "0", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip()

    r = cli(site, "export", str(run), "--out", str(exp))
    assert r.returncode == 0, r.stderr[-3000:]
    r = cli(site, "eval", str(exp), "--json", "--max-batches", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["nll_nats_per_token"] == ev["nll_nats_per_token"]

    # its section is refused for another method, and another method's key for it, in one line each
    r = cli(site, "train", *base, "train.steps=4", "duo.gamma_min=-4")
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1, r.stderr
    assert "duo.gamma_min belongs to method duo" in err[0] and "section smooth (smoothing)" in err[0]
    r = cli(site, "train", "--preset", "debug", "--out", str(tmp_path / "r2"), "smooth.smoothing=0.1")
    assert r.returncode == 2 and "smooth.smoothing belongs to method smooth-ar" in r.stderr, r.stderr
    r = cli(site, "train", *base, "smooth.smoothing=1.5")
    assert r.returncode == 2 and "invalid config value smooth.smoothing: must be in [0, 1)" in r.stderr, r.stderr


def test_without_the_package_the_method_is_unknown(tmp_path):
    r = cli(tmp_path, "train", "--preset", "debug", "--out", str(tmp_path / "run"), "method=smooth-ar")
    assert r.returncode == 2 and "unknown method 'smooth-ar'" in r.stderr, r.stderr
    assert "smooth-ar" not in METHODS


def test_a_method_registered_twice_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    site = install_smooth_ar(tmp_path / "site")
    install(site, "other-ar", {"smooth-ar": "other_ar:OtherAR"})  # a second package, same name
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(ConfigError, match=r"^method 'smooth-ar' is registered twice: smooth_ar:SmoothAR by plug-in"):
        registry.method_names()
    assert main(["train", "--preset", "debug", "--out", str(tmp_path / "run"), "method=replaid"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "registered twice" in err[0] and "other_ar:OtherAR by plug-in other-ar 0.1" in err[0]


def test_a_plug_in_cannot_take_a_built_in_name(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(install(tmp_path / "site", "evil", {"mdlm": "smooth_ar:SmoothAR"})))
    with pytest.raises(
        ConfigError, match=r"method 'mdlm' is registered twice: replaid.methods.mdlm:MDLMMethod by replaid"
    ):
        resolve("debug", None, ["method=mdlm"])


BROKEN = {
    "missing": ("no_such_module_i35:M", r"cannot be loaded: ModuleNotFoundError: No module named 'no_such_module_i35'"),
    "raises": ("raises_i35:M", r"cannot be loaded: RuntimeError: plug-in bug"),
    "not-a-class": ("plain_i35:value", r"is not a replaid method"),
    "misnamed": ("plain_i35:Named", r"declares name = 'other'; register it under its own name"),
    "not-a-method": ("plain_i35:Lookalike", r"is not a replaid method"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_plug_in_is_named_in_one_line(tmp_path, monkeypatch, name):
    target, msg = BROKEN[name]
    mods = {
        "raises_i35": "raise RuntimeError('plug-in bug')\n",
        "plain_i35": (
            "value = 1\n"
            "class Named:\n    name, kind, samplers = 'other', 'x', ()\n    build_model = eval_bound = None\n"
            "class Lookalike:\n    name, kind, samplers = 'not-a-method', 'x', ()\n"
            "    build_model = eval_bound = None\n"
        ),
    }
    monkeypatch.syspath_prepend(str(install(tmp_path / "site", f"broken-{name}", {name: target}, mods)))
    with pytest.raises(ConfigError) as e:
        method_class(name)
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"method '{name}' ({target}, from plug-in broken-{name} 0.1)"), text
    assert __import__("re").search(msg, text), text
    assert method_class("mdlm").name == "mdlm"  # the other methods are unaffected
    for mod in mods:
        sys.modules.pop(mod, None)


def test_the_plug_in_passes_the_method_contract_in_process(tmp_path, monkeypatch):
    """Build, loss and gradient, bound and state round trip of the plug-in, as the contract test does."""
    import torch

    monkeypatch.syspath_prepend(str(install_smooth_ar(tmp_path / "site")))
    cls = method_class("smooth-ar")
    assert list(METHODS)[-1] == "smooth-ar" and METHODS["smooth-ar"] is cls
    cfg = resolve("debug", None, ["method=smooth-ar", "smooth.smoothing=0.2"])
    assert cfg.options.smoothing == 0.2 and cfg.smooth is cfg.options
    m = cls(cfg)
    model = m.build_model(50)
    x = torch.randint(0, 50, (2, cfg.data.seq_len), generator=torch.Generator().manual_seed(0))
    loss, _ = m.train_loss(model, x, torch.Generator().manual_seed(0))
    loss.backward()
    assert torch.isfinite(loss) and any(p.grad is not None for p in model.parameters())
    nll = m.eval_bound(model, x, None)["nll"]
    assert nll.shape == (2,) and bool(torch.isfinite(nll).all())
    m.load_state_dict(m.state_dict())
    shutil.rmtree(tmp_path / "site")
    sys.modules.pop("smooth_ar", None)
