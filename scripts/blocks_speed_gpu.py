"""The GPU block-speed page's data and figure (docs/results/blocks/speed-gpu/).

    .venv/bin/python scripts/blocks_speed_gpu.py            # rows.json from the 0.1B log, then sdpa.png
    .venv/bin/python scripts/blocks_speed_gpu.py --plot     # the PNG only

``owt-0.1b/bench_blocks.log``: the per-row lines ``bench_blocks.py`` prints as each configuration ends (the
run was stopped by its call's time limit before it wrote its JSON, so the log is the record); parsed into
``owt-0.1b/rows.json``. ``sdpa.png``: ``sdpa/sdpa_ab.json`` (the A/B of cached attention with and without
cuDNN) and ``sdpa/sdpa_order.json`` (the order-controlled AR check) side by side.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "docs" / "results" / "blocks" / "speed-gpu"
LINE = re.compile(
    r"^(?P<family>\w+)\s+(?P<method>\w+)\s+b=\s*(?P<b>[\d-]+)\s+T=\s*(?P<T>[\d-]+)\s+B=\s*(?P<batch>\d+)\s+"
    r"(?P<length_x>\d+)x:\s+(?P<seconds>[\d.]+)s\s+first block\s+(?P<ttfb_s>[\d.]+)s\s+(?P<tokens_per_s>[\d.]+) tok/s"
    r"\s+nfe\s+(?P<nfe>\d+)\s+peak \+(?P<peak_mib>[\d.]+) MiB$"
)


def parse_log(text: str) -> list[dict]:
    """Every finished configuration's line of a ``bench_blocks.py`` log as a dict (numbers as printed)."""
    rows = []
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if m is None:
            continue
        g = m.groupdict()
        row: dict = {"family": g["family"], "method": g["method"]}
        row["block"] = None if g["b"] == "-" else int(g["b"])
        row["steps"] = None if g["T"] == "-" else int(g["T"])
        row.update(batch=int(g["batch"]), length_x=int(g["length_x"]), nfe=int(g["nfe"]))
        for k in ("seconds", "ttfb_s", "tokens_per_s", "peak_mib"):
            row[k] = float(g[k])
        rows.append(row)
    return rows


def plot(page: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ab = json.loads((page / "sdpa" / "sdpa_ab.json").read_text())["rows"]
    order = json.loads((page / "sdpa" / "sdpa_order.json").read_text())["rows"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    labels, every, without = [], [], []
    for fam, m in (("ar", "ar"), ("blocks", "mdlm"), ("blocks", "replaid")):
        for B in (1, 16):
            cell = [r for r in ab if r["family"] == fam and r.get("method", "ar") == m and r["batch"] == B]
            cell = [r for r in cell if r.get("gen", "cpu_gen") == "cpu_gen"]
            ms = {r["sdpa"]: r.get("ms_per_call", r.get("ms_per_nfe")) for r in cell}
            labels.append(
                f"{'AR' if fam == 'ar' else m.replace('mdlm', 'MDLM').replace('replaid', 'RePlaid')}\nbatch {B}"
            )
            every.append(ms["all"])
            without.append(ms["no_cudnn"])
    x = range(len(labels))
    a1.bar([i - 0.2 for i in x], every, 0.4, label="every SDPA backend (the code before)", color="#c44e52")
    a1.bar([i + 0.2 for i in x], without, 0.4, label="cuDNN left out (now)", color="#4c72b0")
    a1.set_xticks(list(x), labels)
    a1.set_ylabel("ms per network call")
    a1.set_title("owt-0.1b on an H100: AR per token, blocks (b=16) per NFE", fontsize=10)
    a1.legend(fontsize=8)
    names = {
        ("all", "fresh"): "cuDNN,\nnew lengths",
        ("no_cudnn", "-"): "no cuDNN",
        ("all", "seen"): "cuDNN,\nseen lengths",
    }
    for B, colour in ((3, "#55a868"), (5, "#8172b2")):
        rows = [r for r in order if r["batch"] == B]
        xs = list(range(len(rows)))
        a2.plot(xs, [r["ms_per_call"] for r in rows], "o-", color=colour, label=f"AR, batch {B}")
        a2.set_xticks(
            xs, [names[(r["sdpa"], r["shapes"])] + f"\n({r['gen'].split('_')[0]} gen)" for r in rows], fontsize=7
        )
    a2.set_ylabel("ms per AR call")
    a2.set_title("in order: the first arm meets each key length first", fontsize=10)
    a2.set_ylim(bottom=0)
    a2.legend(fontsize=8)
    fig.tight_layout()
    out = page / "sdpa.png"
    fig.savefig(out, dpi=110)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plot", action="store_true", help="the PNG only")
    ap.add_argument("--page", type=Path, default=PAGE)
    a = ap.parse_args(argv)
    if not a.plot:
        log = a.page / "owt-0.1b" / "bench_blocks.log"
        rows = parse_log(log.read_text())
        doc = {"source": "owt-0.1b/bench_blocks.log (per-row lines of benchmarks/bench_blocks.py)", "rows": rows}
        (a.page / "owt-0.1b" / "rows.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{len(rows)} rows -> {a.page / 'owt-0.1b' / 'rows.json'}")
    print(f"wrote {plot(a.page)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
