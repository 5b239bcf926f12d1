"""One strategy per method kind (issue 51 §2): the kinds' files are the only places that name a kind, the
registry's names are the CLI's, and a kind of one's own, declared in one file with its method
(``tests/plugins/oneshot``), trains, evaluates, samples and is served (the playground and
``/v1/completions``) with no edit to replaid.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from replaid.methods import method_class
from replaid.methods.base import KINDS
from replaid.sampling.names import SAMPLER_NAMES
from replaid.sampling.registry import REGISTRY, get_sampler
from replaid.sampling.strategy import KindStrategy, strategy_of
from test_external_method import cli, install

SRC = Path(__file__).resolve().parents[1] / "src" / "replaid"
PLUGIN = Path(__file__).parent / "plugins" / "oneshot"
KIND_FILES = ("methods/", "sampling/kinds/")  # where a kind is declared, and its strategy


def kind_switches(root: Path) -> list[str]:
    """Every ``Kind.X`` outside the kinds' own files: ``file:line``."""
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith(KIND_FILES):
            continue
        out += [f"{rel}:{i}" for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\bKind\.", line)]
    return out


def test_only_the_kinds_own_files_name_a_kind(tmp_path):
    assert kind_switches(SRC) == []
    planted = tmp_path / "replaid" / "sampling"
    planted.mkdir(parents=True)
    (planted / "x.py").write_text("if run.method.kind is Kind.MASKED:\n    pass\n")
    assert kind_switches(tmp_path / "replaid") == ["sampling/x.py:1"]


def test_every_kind_has_a_strategy_and_the_registry_names_are_the_clis():
    for kind in KINDS:
        assert isinstance(strategy_of(kind), KindStrategy)
        assert all(s.kind is kind for s in strategy_of(kind).samplers)
    assert tuple(dict.fromkeys(name for _, name in REGISTRY)) == SAMPLER_NAMES
    assert len(REGISTRY) == len(list(REGISTRY))


def install_oneshot(where: Path) -> Path:
    return install(where, "oneshot", {"oneshot": "oneshot:OneShot"}, {"oneshot": (PLUGIN / "oneshot.py").read_text()})


@pytest.mark.slow
def test_a_kind_in_one_file_trains_evaluates_samples_and_is_served(tmp_path, monkeypatch):
    site = install_oneshot(tmp_path / "site")
    run = tmp_path / "run"
    r = cli(site, "train", "--preset", "debug", "--method", "oneshot", "--out", str(run), "--no-progress",
            "train.steps=4", "eval.max_batches=1")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]

    r = cli(site, "eval", str(run), "--json", "--max-batches", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert 0 < json.loads(r.stdout.strip().splitlines()[-1])["nll_nats_per_token"] < 20

    r = cli(site, "sample", str(run), "--num", "2", "--seed", "0", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in r.stdout.strip().splitlines()]
    assert len(rows) == 2 and all(row["nfe"] == 1 and row["sampler"] == "ancestral" for row in rows)

    # served, in process: the plug-in on the path as the CLI had it
    from fastapi.testclient import TestClient

    from replaid.store.loading import load_run
    from replaid.web.app import create_app
    from replaid.web.engine import Limits

    monkeypatch.syspath_prepend(str(site))
    try:
        assert method_class("oneshot").kind.strategy == "oneshot:STRATEGY"
        loaded = load_run(run, device="cpu")
        client = TestClient(create_app([str(run)], Limits(raw=True), runs=[loaded]))
        ev = [json.loads(x[5:]) for x in client.post("/api/generate", json={"run": "run", "samples": 2}).text.splitlines()
              if x.startswith("data:")]  # fmt: skip
        assert [e["type"] for e in ev][-2:] == ["step", "done"] and ev[-2]["final"], ev[-3:]
        assert ev[-1]["nfe"] == 1 and ev[-1]["texts"] == [row["text"] for row in rows]  # the CLI's, same seed 0
        resp = client.post("/v1/completions", json={"model": "run", "prompt": "", "max_tokens": 8, "seed": 0})
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["finish_reason"] in ("length", "stop")
        assert get_sampler(loaded.method).fn.__module__ == "oneshot"
    finally:
        sys.modules.pop("oneshot", None)
        strategy_of.cache_clear()


def test_a_kind_whose_strategy_does_not_import_is_named_in_one_line():
    from replaid.methods.base import Kind

    with pytest.raises(ValueError, match=r"the broken kind's strategy 'nowhere_at_all:STRATEGY' does not import"):
        strategy_of(Kind("broken", "nowhere_at_all:STRATEGY"))
    with pytest.raises(ValueError, match=r"is not a KindStrategy"):
        strategy_of(Kind("wrong", "replaid.sampling.registry:REGISTRY"))
