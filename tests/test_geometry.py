"""Embedding geometry: PCA scree against an independent eigen-decomposition, k_90, the POS
neighbourhood score, the rows each model contributes, the CE-overlay normalisation, and the commands."""

import json

import numpy as np
import pytest

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


def test_scree_of_a_matrix_of_known_rank():
    """Rows spanning exactly r dimensions (plus an offset, removed by centring): r non-zero components
    with the planted variances, nothing after them."""
    rng = np.random.default_rng(2)
    r, d = 3, 10
    Q, _ = np.linalg.qr(rng.normal(size=(d, r)))  # r orthonormal directions in R^d
    Z = rng.normal(size=(400, r))
    Z = (Z - Z.mean(0)) @ np.linalg.inv(np.linalg.cholesky(np.cov(Z, rowvar=False))).T  # exactly white
    X = (Z * np.sqrt([6.0, 3.0, 1.0])) @ Q.T + 5.0
    s = geo.pca_scree(X)
    assert s["explained_variance"].shape == (d,)
    assert np.allclose(s["explained_variance"][:r], [6.0, 3.0, 1.0], rtol=1e-10)
    assert np.all(s["explained_variance"][r:] < 1e-20 * s["explained_variance"][0])
    assert s["cumulative"][r - 1] == pytest.approx(1.0, abs=1e-12) and s["k90"] == 2  # 0.6 + 0.3 reaches 0.9
    assert np.allclose(s["ratio"][:r], [0.6, 0.3, 0.1])


def test_components_for_boundaries():
    assert geo.components_for(np.array([0.5, 0.9, 1.0])) == 2  # reaching 0.9 exactly counts
    assert geo.components_for(np.array([0.5, 0.89, 1.0])) == 3
    assert geo.components_for(np.array([0.95, 1.0])) == 1


def test_mean_pairwise_cosine_against_every_pair():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 6)) * rng.uniform(0.5, 3, size=(40, 1))  # rows of different norms
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    brute = np.mean([U[i] @ U[j] for i in range(40) for j in range(40) if i != j])
    assert geo.mean_pairwise_cosine(X) == pytest.approx(brute, abs=1e-12)
    collapsed = np.ones((5, 3)) + 1e-3 * rng.normal(size=(5, 3))  # one shared direction
    assert geo.mean_pairwise_cosine(collapsed) > 0.999
    assert geo.mean_pairwise_cosine(np.vstack([np.eye(3), -np.eye(3)])) == pytest.approx(-1 / 5)


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
    from replaid.methods import get_method
    from replaid.model.replaid import RePlaid
    from replaid.model.tokens import TokenDiT
    from replaid.presets import resolve

    cfg = resolve("debug", None, [])
    m = RePlaid(cfg.model, cfg.diffusion, 40)
    E = geo.embedding_rows(get_method(cfg), m)
    assert E.shape == (40, 16) and np.allclose(np.linalg.norm(E, axis=1), 1.0, atol=1e-6)
    md = resolve("debug", None, ["method=mdlm"])
    t = TokenDiT(md.model, 41, 40)  # + [MASK]
    assert np.allclose(geo.embedding_rows(get_method(md), t), t.embed.weight[:40].detach().double().numpy())
    f = resolve("debug", None, ["method=mdlm", "model.factored_embedding=true", "model.d_e=4"])
    tf = TokenDiT(f.model, 41, 40)
    Ef = geo.embedding_rows(get_method(f), tf)
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


@pytest.fixture(scope="module")
def debug_run(tmp_path_factory):
    """A two-step debug RePlaid run (the commands' input)."""
    from replaid.cli import main

    a = tmp_path_factory.mktemp("geometry") / "a"
    assert main(["train", "--preset", "debug", "--out", str(a), "--no-progress", "train.steps=2"]) == 0
    return a


def test_geometry_and_multi_run_diagnose_commands(debug_run, tmp_path, capsys):
    pytest.importorskip("sklearn")
    from replaid.cli import main

    a = debug_run
    out = tmp_path / "geo"
    assert (
        main(
            [
                "geometry",
                str(a),
                str(a),
                "--labels",
                "rp",
                "rp2",
                "--out",
                str(out),
                "--min-count",
                "1",
                "--no-tsne",
                "--json",
            ]
        )
        == 0
    )
    s = json.loads((out / "geometry.json").read_text())
    from replaid.store.loading import load_run

    r = load_run(a)
    E = r.model.embedding_matrix().detach().double().numpy()  # the rows, independently of the command
    ratio = np.linalg.svd(E - E.mean(0), compute_uv=False) ** 2
    ratio = ratio / ratio.sum()
    assert s["rp"]["d"] == 16 and s["rp"]["k90_all_rows"] == int(np.searchsorted(np.cumsum(ratio), 0.9 - 1e-12) + 1)
    assert s["rp"]["top_ratio_all_rows"] == pytest.approx(ratio[0], rel=1e-9)
    assert s["rp"]["nelbo_ppl"] == pytest.approx(json.loads((a / "final_eval.json").read_text())["eval"]["nelbo_ppl"])
    assert (out / "scree.png").is_file() and (out / "scree_all_rows.png").is_file()
    lines = (out / "scree.csv").read_text().splitlines()
    assert lines[0] == "label,rows,component,explained_ratio,cumulative" and len(lines) == 1 + 4 * 16
    # bad input: one line, exit 2, nothing written
    capsys.readouterr()
    assert main(["geometry", str(a), "--labels", "x", "y", "--out", str(tmp_path / "bad")]) == 2
    assert "replaid: error:" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    # several runs through diagnose: one folder each and the normalised CE overlay
    d = tmp_path / "diag"
    assert (
        main(
            [
                "diagnose",
                str(a),
                str(a),
                "--labels",
                "x",
                "y",
                "--out",
                str(d),
                "--batches",
                "1",
                "--grid",
                "3",
                "--batch-size",
                "2",
            ]
        )
        == 0
    )
    j = json.loads((d / "diagnose.json").read_text())
    assert set(j["ce_overlay"]) == {"x", "y"} and (d / "x" / "curves.csv").is_file()
    assert j["ce_overlay"]["x"]["ce_linear_r2"] == pytest.approx(j["runs"]["x"]["ce_linear_r2"])
    assert (d / "ce_overlay.png").is_file()


@pytest.mark.slow
def test_geometry_tsne_and_pos_path(debug_run, tmp_path):
    """The t-SNE / POS path of ``replaid geometry``: spaCy tags a few rows of the training split, each
    token's dominant POS colours the t-SNE; the neighbourhood scores in geometry.json are those of the
    rows and points the command wrote (recomputed here from its CSV)."""
    pytest.importorskip("sklearn")
    from replaid.eval import pos

    try:
        pos.load_spacy()
    except Exception as e:
        pytest.skip(f"spaCy's English model is not installed ({e.__class__.__name__})")
    from replaid.cli import main
    from replaid.store.loading import load_run

    a = debug_run
    out = tmp_path / "geo"
    assert (
        main(
            [
                "geometry",
                str(a),
                "--labels",
                "rp",
                "--out",
                str(out),
                "--min-count",
                "1",
                "--tsne-max",
                "80",
                "--pos-row-len",
                "64",
                "--pos-max-rows",
                "6",
                "--knn",
                "3",
            ]
        )
        == 0
    )
    s = json.loads((out / "geometry.json").read_text())["rp"]
    assert (out / "tsne_rp.png").is_file() and not s["pos_counts_cached"]
    import csv

    with open(out / "tsne_rp.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 80 and {r["pos"] for r in rows} - {""} <= set(pos.UPOS) and any(r["pos"] for r in rows)
    dom = np.array([pos.UPOS.index(r["pos"]) if r["pos"] else -1 for r in rows])
    Y = np.array([[float(r["x"]), float(r["y"])] for r in rows])
    assert s["pos_knn_tsne"]["agreement"] == pytest.approx(geo.pos_knn_agreement(Y, dom, 3)["agreement"], abs=1e-3)
    E = geo.embedding_rows(load_run(a).method, load_run(a).model)[[int(r["token_id"]) for r in rows]]
    assert s["pos_knn"] == pytest.approx(geo.pos_knn_agreement(E, dom, 3))
