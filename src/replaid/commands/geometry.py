"""``replaid geometry``: PCA scree, t-SNE by dominant part of speech, POS neighbourhood agreement."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replaid.commands import NONNEGATIVE, POSITIVE, SEED, add_command, check_out, emit, run_labels
from replaid.schema import dumps as strict_dumps

if TYPE_CHECKING:
    import numpy as np

    from replaid.store.loading import Run

EXAMPLE = (
    "example: replaid geometry runs/wiki runs/wiki-ce1 --labels nelbo ce1 --out runs/geometry "
    "--min-count 20 --tsne-max 3000"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(
        sub,
        "geometry",
        "Embedding geometry: PCA scree, t-SNE coloured by part of speech.",
        EXAMPLE,
        description="For each run's token-embedding matrix (RePlaid/Plaid E; AR/MDLM/Duo input table): "
        "the PCA scree (CSV/JSON, components for 90%, one PNG overlaying the runs, on all "
        "rows and on the tokens frequent in the training data) and a t-SNE of the frequent "
        "rows coloured by each token's dominant POS (spaCy en_core_web_sm over the run's "
        "training split, cached per tokenizer and corpus; needs the 'geometry' extra).",
    )
    p.add_argument("runs", nargs="+", help="run or checkpoint directories")
    p.add_argument("--out", required=True, help="folder for scree.csv, scree*.png, tsne_*.png/csv, geometry.json")
    p.add_argument("--labels", nargs="+", help="one label per run (default: the run folder names)")
    p.add_argument(
        "--min-count",
        type=NONNEGATIVE,
        default=20,
        help="'frequent' tokens: seen at least this often in the run's training split",
    )
    p.add_argument("--tsne-max", type=POSITIVE, default=3000, help="t-SNE on at most this many most frequent tokens")
    p.add_argument("--no-tsne", action="store_true", help="skip t-SNE and POS tagging (PCA only)")
    p.add_argument(
        "--pos-split", default="train", choices=["train", "valid", "test"], help="split whose rows are POS-tagged"
    )
    p.add_argument("--pos-row-len", type=POSITIVE, default=1024, help="token rows decoded and tagged (paper: 1024)")
    p.add_argument(
        "--pos-max-rows", type=NONNEGATIVE, default=0, help="tag at most this many rows (0 = the whole split)"
    )
    p.add_argument("--knn", type=POSITIVE, default=10, help="neighbours for the POS agreement score")
    p.add_argument("--no-ema", action="store_true", help="the raw weights, not the EMA")
    p.add_argument("--seed", type=SEED, default=0, help="t-SNE seed")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=run)


def _pos_counts(r: Run, args: argparse.Namespace) -> tuple[np.ndarray, Path, bool]:
    """The run's (V, 18) POS count matrix, computed once per (tokenizer, corpus, rows) and cached."""
    import numpy as np

    from replaid.data.cache import cache_key
    from replaid.eval import pos

    d, tok = r.cfg.data, r.data.tokenizer
    nlp = pos.load_spacy()
    key = "|".join(
        [
            cache_key(d.source, args.pos_split, tok, d.text_field, d.max_docs),
            f"rows{args.pos_row_len}",
            f"max{args.pos_max_rows}",
            pos.spacy_name(nlp),
            "v1",
        ]
    )
    encode = pos.hf_offsets(tok)

    def compute() -> np.ndarray:
        arr = np.asarray(r.data.array(args.pos_split)[0])
        n = len(arr) // args.pos_row_len
        if args.pos_max_rows:
            n = min(n, args.pos_max_rows)
        if n == 0:
            raise ValueError(
                f"the {args.pos_split} split has fewer than --pos-row-len={args.pos_row_len} tokens; "
                f"lower --pos-row-len"
            )
        rows = (arr[i * args.pos_row_len : (i + 1) * args.pos_row_len].tolist() for i in range(n))
        return pos.count_pos(rows, tok.decode, encode, r.data.vocab_size, nlp=nlp, progress=True, total=n)

    return pos.cached_pos_counts(r.data.cache, key, compute)


def _tsne(
    r: Run, args: argparse.Namespace, E: np.ndarray, ids: np.ndarray, freq: np.ndarray, out: Path, label: str
) -> dict[str, Any]:
    """The part-of-speech agreement of nearest neighbours among the ``--tsne-max`` most frequent tokens'
    embeddings (E (V, d)), and with more than 10 of them, their t-SNE map (PNG and CSV)."""
    from replaid.eval import geometry as geo
    from replaid.eval.pos import UPOS, dominant_pos, pos_entropy

    out_: dict[str, Any] = {}
    C, cpath, hit = _pos_counts(r, args)
    dom, H = dominant_pos(C), pos_entropy(C)
    sel = ids[: args.tsne_max]
    out_["pos_counts"] = str(cpath)
    out_["pos_counts_cached"] = bool(hit)
    out_["pos_knn"] = geo.pos_knn_agreement(E[sel], dom[sel], args.knn)
    if len(sel) > 10:
        Y = geo.tsne_2d(E[sel], seed=args.seed)
        tok = r.data.tokenizer
        names = [tok.decode([int(i)]) for i in sel]
        out_["pos_knn_tsne"] = geo.pos_knn_agreement(Y, dom[sel], args.knn)
        kk = out_["pos_knn"]
        geo.plot_tsne(
            Y,
            dom[sel],
            freq[sel],
            UPOS,
            out / f"tsne_{label}.png",
            annotate=names,
            title=f"{label}: t-SNE of the {len(sel)} most frequent tokens (count >= {args.min_count}), "
            f"d={E.shape[1]}\nPOS agreement of {args.knn} nearest neighbours "
            f"{kk['agreement']:.3f} (chance {kk['chance']:.3f})",
        )
        with open(out / f"tsne_{label}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["token_id", "token", "x", "y", "count", "pos", "pos_entropy_bits"])
            for j, i in enumerate(sel):
                w.writerow(
                    [
                        int(i),
                        names[j],
                        f"{Y[j, 0]:.5g}",
                        f"{Y[j, 1]:.5g}",
                        int(freq[i]),
                        UPOS[dom[i]] if dom[i] >= 0 else "",
                        f"{H[i]:.4g}",
                    ]
                )
        out_["tsne_png"] = f"tsne_{label}.png"
    return out_


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from replaid.eval import geometry as geo
    from replaid.store.checkpoint import load_state
    from replaid.store.loading import load_run
    from replaid.store.runfolder import recorded_final_eval

    if args.min_count < 1 or args.tsne_max < 10 or args.pos_row_len < 2 or args.knn < 1:
        raise ValueError("need --min-count >= 1, --tsne-max >= 10, --pos-row-len >= 2, --knn >= 1")
    check_out(args.out, protected=tuple(args.runs), names=("geometry.json",))
    labels = run_labels(args.runs, args.labels)
    runs = [load_run(p, use_ema=not args.no_ema) for p in args.runs]  # all inputs checked before writing
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary, screes_all, screes_freq, rows = {}, [], [], []
    for label, r in zip(labels, runs, strict=True):
        E = geo.embedding_rows(r.method, r.model)  # (V, d)
        freq = geo.token_frequency(r.data.array("train")[0], r.data.vocab_size)
        ids = geo.frequent_rows(freq, args.min_count)
        s_all = geo.pca_scree(E)
        s_freq = geo.pca_scree(E[ids]) if len(ids) >= 2 else None
        screes_all.append((label, s_all))
        if s_freq is not None:
            screes_freq.append((label, s_freq))
        for which, s in (("all", s_all), ("frequent", s_freq)):
            if s is None:
                continue
            for k in range(len(s["ratio"])):
                rows.append([label, which, k + 1, f"{s['ratio'][k]:.8g}", f"{s['cumulative'][k]:.8g}"])
        st = load_state(r.ckpt)
        ev = recorded_final_eval(r.ckpt, st) or {}
        info = {
            "run": str(r.ckpt),
            "method": r.cfg.method,
            "step": r.step,
            "weights": "ema" if r.ema_loaded else "raw",
            "V": int(E.shape[0]),
            "d": int(E.shape[1]),
            "k90_all_rows": s_all["k90"],
            "top_ratio_all_rows": float(s_all["ratio"][0]),
            "frequent_tokens": int(len(ids)),
            "min_count": args.min_count,
            "k90_frequent": s_freq["k90"] if s_freq else None,
            "top_ratio_frequent": float(s_freq["ratio"][0]) if s_freq else None,
            "row_norm_mean": float(np.linalg.norm(E, axis=1).mean()),
            "mean_cosine_frequent": geo.mean_pairwise_cosine(E[ids]) if len(ids) >= 2 else None,
            "nelbo_ppl": ev.get("nelbo_ppl"),
            "nelbo_nats_per_token": ev.get("nelbo_nats_per_token"),
        }
        if not args.no_tsne:
            info.update(_tsne(r, args, E, ids, freq, out, label))
        summary[label] = info
    with open(out / "scree.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "rows", "component", "explained_ratio", "cumulative"])
        w.writerows(rows)
    geo.plot_scree(screes_all, out / "scree_all_rows.png", "PCA scree of all V embedding rows")
    if screes_freq:
        geo.plot_scree(
            screes_freq,
            out / "scree.png",
            f"PCA scree of the rows of tokens seen >= {args.min_count} times in training",
        )
    (out / "geometry.json").write_text(strict_dumps(summary, indent=2))
    emit(
        {
            k: {
                kk: v[kk]
                for kk in ("d", "k90_all_rows", "k90_frequent", "mean_cosine_frequent", "frequent_tokens", "nelbo_ppl")
            }
            for k, v in summary.items()
        },
        args.json,
    )
    return 0
