"""Zero-shot perplexity of runs on the MDLM-lineage suite (conventions: ``replaid/data/zeroshot.py``).

Each wrapped row ``[BOS] ... [EOS]`` of the model's length L is scored with the run's own
``method.eval_bound``: the NELBO bound (diffusion methods: RePlaid, Plaid, MDLM, Duo; ``eval.t_samples``
diffusion times per row) or the exact NLL (AR: all L tokens, the first given the AR model's input-only
BOS id, see ``replaid/methods/ar.py``). Token-level PPL = ``exp(sum of nats / number of tokens)``,
the sums in float64 (MDLM aggregates the same way across batches).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from tqdm.auto import tqdm

from replaid.data.zeroshot import bos_eos, load_documents, wrap_documents
from replaid.store.loading import Run


@torch.no_grad()
def zeroshot_run(
    run: Run,
    names: list[str],
    data_dir: str | None,
    split: str | None = None,
    batch_size: int = 8,
    max_rows: int = 0,
    t_samples: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """``{dataset: {bound, nats_per_token, ppl, tokens, rows, source, ...}}`` for one loaded run."""
    cfg = run.cfg
    if t_samples is not None:
        cfg.eval.t_samples = t_samples
    L = cfg.data.seq_len
    tok = run.tokenizer
    bos, eos = bos_eos(tok)
    device = next(run.model.parameters()).device
    out = {}
    for name in names:
        docs, origin = load_documents(name, split, data_dir)
        rows = wrap_documents(tok.encode_batch(docs), L, bos, eos)
        if max_rows:
            rows = rows[:max_rows]
        if len(rows) == 0:
            raise ValueError(f"zero-shot set '{name}' gives no row of length {L}; it is shorter than the model length")
        gen = torch.Generator().manual_seed(seed)
        total, n_tok, t0, key = 0.0, 0, time.time(), None
        for s in tqdm(range(0, len(rows), batch_size), desc=f"zeroshot {name}", disable=not progress, leave=False):
            x = torch.from_numpy(rows[s : s + batch_size]).to(device)
            r = run.method.eval_bound(run.model, x, gen)
            key = "nelbo" if "nelbo" in r else "nll"
            total += float(r[key].double().sum()) * L  # per-token mean of each row x L tokens
            n_tok += x.numel()
        nats = total / n_tok
        out[name] = {
            "bound": "NELBO (upper bound)" if key == "nelbo" else "exact NLL",
            "nats_per_token": nats,
            "ppl": math.exp(nats),
            "tokens": n_tok,
            "rows": int(len(rows)),
            "documents": len(docs),
            "source": origin,
            "seq_len": L,
            "seconds": round(time.time() - t0, 1),
            **({"t_samples": cfg.eval.t_samples} if key == "nelbo" else {}),
        }
    return out


def markdown_table(results: dict[str, dict[str, Any]], names: list[str]) -> str:
    """Runs as rows, datasets as columns (PPL; diffusion rows are bounds, marked <=)."""
    lines = ["| run | method | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for label, r in results.items():
        cells = []
        for n in names:
            d = r["datasets"].get(n)
            cells.append("-" if d is None else (("<= " if d["bound"].startswith("NELBO") else "") + f"{d['ppl']:.2f}"))
        lines.append(f"| {label} | {r['method']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
