"""Embedding geometry: PCA scree against an independent eigen-decomposition, k_90, the POS
neighbourhood score, the rows each model contributes, the CE-overlay normalisation, and the commands."""
import json

import numpy as np
import pytest
import torch

from replaid.eval import geometry as geo
from replaid.eval.diagnostics import ce_overlay, linear_r2


def test_pca_scree_matches_covariance_eigenvalues_and_k90():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 6)) @ rng.normal(size=(6, 6)) + 3.0  # offset: the rows must be centred
    s = geo.pca_scree(X)
    lam = np.sort(np.linalg.eigvalsh(np.cov(X, rowvar=False)))[::-1]  # float64 reference
    assert np.allclose(s["explained_variance"], lam, rtol=1e-10)
    assert np.allclose(s["ratio"], lam / lam.sum()) and s["cumulative"][-1] == pytest.approx(1.0)
    assert s["k90"] == int(np.argmax(np.cumsum(lam) / lam.sum() >= 0.9) + 1)
    # planted spectrum: variances 50, 30, 10, 5, 3, 2 (%) on orthogonal axes -> k90 = 3 exactly
    Q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    Z = rng.normal(size=(20000, 6))
    Z = (Z - Z.mean(0)) @ np.linalg.inv(np.linalg.cholesky(np.cov(Z, rowvar=False))).T  # exactly white
    Y = Z * np.sqrt([50, 30, 10, 5, 3, 2]) @ Q.T
    sp = geo.pca_scree(Y)
    assert np.allclose(sp["ratio"], [0.5, 0.3, 0.1, 0.05, 0.03, 0.02], atol=1e-9)
    assert sp["k90"] == 3


def test_components_for_boundaries():
    assert geo.components_for(np.array([0.5, 0.9, 1.0])) == 2  # reaching 0.9 exactly counts
    assert geo.components_for(np.array([0.5, 0.89, 1.0])) == 3
    assert geo.components_for(np.array([0.95, 1.0])) == 1


def test_frequency_and_frequent_rows():
    freq = geo.token_frequency(np.array([3, 3, 3, 1, 1, 0]), 5)
    assert freq.tolist() == [1, 2, 0, 3, 0]
    assert geo.frequent_rows(freq, 2).tolist() == [3, 1]
    assert geo.frequent_rows(freq, 1, max_rows=2).tolist() == [3, 1]


def test_pos_knn_agreement_planted_clusters_and_chance():
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(3, 8)) * 10
    labels = np.repeat([0, 1, 2], [60, 30, 10])
    X = centres[labels] + rng.normal(size=(100, 8)) * 0.1
    r = geo.pos_knn_agreement(X, labels, k=5)
    assert r["agreement"] == pytest.approx(1.0)
    assert r["chance"] == pytest.approx(0.6**2 + 0.3**2 + 0.1**2)
    shuffled = geo.pos_knn_agreement(rng.normal(size=(100, 8)), labels, k=5)
    assert abs(shuffled["agreement"] - shuffled["chance"]) < 0.15
    assert geo.pos_knn_agreement(X, np.where(labels == 2, -1, labels), k=5)["n"] == 90  # unseen dropped


def test_embedding_rows_of_each_model_family():
    from replaid.model.replaid import RePlaid
    from replaid.model.tokens import TokenDiT
    from replaid.presets import resolve

    cfg = resolve("debug", None, [])
    m = RePlaid(cfg.model, cfg.diffusion, 40)
    E = geo.embedding_rows(m)
    assert E.shape == (40, 16) and np.allclose(np.linalg.norm(E, axis=1), 1.0, atol=1e-6)
    t = TokenDiT(cfg.model, 41, 40)  # + [MASK]
    assert np.allclose(geo.embedding_rows(t), t.embed.weight[:40].detach().double().numpy())
    f = resolve("debug", None, ["model.factored_embedding=true", "model.d_e=4"])
    tf = TokenDiT(f.model, 41, 40)
    Ef = geo.embedding_rows(tf)
    assert Ef.shape == (40, 4) and np.allclose(np.linalg.norm(Ef, axis=1), 1.0, atol=1e-6)


def test_ce_overlay_normalises_both_axes_and_reports_r2():
    t = np.linspace(0.05, 0.95, 19)
    items = ce_overlay([("lin", t, 2.0 + 5.0 * t), ("quad", t, 1.0 + 3.0 * t**2)])
    for it in items:
        assert it["t"].min() == 0.0 and it["t"].max() == 1.0
        assert it["ce"].min() == 0.0 and it["ce"].max() == 1.0
    assert items[0]["r2"] == pytest.approx(1.0)
    assert np.allclose(items[0]["ce"], items[0]["t"])
    # the straight-line fit's R^2 is the squared correlation of the raw t and CE
    assert items[1]["r2"] == pytest.approx(np.corrcoef(t, t**2)[0, 1] ** 2)
    assert np.allclose(items[1]["ce"], (t**2 - t[0] ** 2) / (t[-1] ** 2 - t[0] ** 2))
    assert items[1]["r2"] == pytest.approx(linear_r2(t, 1.0 + 3.0 * t**2))  # affine-invariant
    assert items[1]["ce_min"] == pytest.approx(1.0 + 3.0 * 0.05**2)


def test_geometry_and_multi_run_diagnose_commands(tmp_path, capsys):
    pytest.importorskip("sklearn")
    from replaid.cli import main

    a = tmp_path / "a"
    assert main(["train", "--preset", "debug", "--out", str(a), "--no-progress", "train.steps=2"]) == 0
    out = tmp_path / "geo"
    assert main(["geometry", str(a), str(a), "--labels", "rp", "rp2", "--out", str(out), "--min-count", "1",
                 "--no-tsne", "--json"]) == 0
    s = json.loads((out / "geometry.json").read_text())
    assert s["rp"]["d"] == 16 and 1 <= s["rp"]["k90_all_rows"] <= 16 and s["rp"]["nelbo_ppl"] > 1
    assert (out / "scree.png").is_file() and (out / "scree_all_rows.png").is_file()
    lines = (out / "scree.csv").read_text().splitlines()
    assert lines[0] == "label,rows,component,explained_ratio,cumulative" and len(lines) == 1 + 4 * 16
    # bad input: one line, exit 2, nothing written
    capsys.readouterr()
    assert main(["geometry", str(a), "--labels", "x", "y", "--out", str(tmp_path / "bad")]) == 2
    assert "replaid: error:" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    # several runs through diagnose: one folder each and the normalised CE overlay
    d = tmp_path / "diag"
    assert main(["diagnose", str(a), str(a), "--labels", "x", "y", "--out", str(d), "--batches", "1",
                 "--grid", "3", "--batch-size", "2"]) == 0
    j = json.loads((d / "diagnose.json").read_text())
    assert set(j["ce_overlay"]) == {"x", "y"} and (d / "x" / "curves.csv").is_file()
    assert j["ce_overlay"]["x"]["ce_linear_r2"] == pytest.approx(j["runs"]["x"]["ce_linear_r2"])
    assert (d / "ce_overlay.png").is_file()
