"""Issue 48 §2's table of arms: per arm (backbone LR, warm-up, width; batch in plateau_batch.py) and method
(MDLM, the recipe, the default RePlaid), the exit steps and tokens, the distance below unigram and the offset
above the same arm's MDLM at the largest budget, and the exit and bound paired against the same method at
the batch-32 defaults. Runs scripts/plateau_study.py once within each arm (``<out>/<arm>/``) and once per
method against the defaults (``<out>/<arm>/vs-<method>/``) and once against the arm's MDLM
(``<out>/<arm>/against-mdlm/``: RePlaid minus MDLM, paired by seed; the defaults' in
``<out>/defaults-against-mdlm/``), then writes ``arms.json``, ``arms.md`` and
``exits.png`` from those studies.

    python scripts/plateau_arms.py runs/plateau-screen runs/plateau-arms --out docs/results/plateau/arms-study
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

ARMS = {"lr3e-4": "backbone LR 3e-4", "wu1000": "warm-up 1,000", "w256": "hidden 256"}
METHODS = {"mdlm": ("mdlm", "MDLM"), "cooc": ("cooc-init", "the recipe"), "replaid": ("replaid", "RePlaid, default")}
BUDGETS = ["300", "600", "1200", "2400"]


def _study() -> Any:
    path = Path(__file__).with_name("plateau_study.py")
    spec = importlib.util.spec_from_file_location("plateau_study", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def finished(grid: Path, cell: str) -> int:
    """The runs of ``cell`` in ``grid`` with a final evaluation."""
    return sum((grid / "runs" / f"{cell}__s{s}" / "final_eval.json").is_file() for s in range(3))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("base", type=Path, help="the grid of the batch-32 defaults (cells mdlm, cooc-init, replaid)")
    p.add_argument("arms", type=Path, help="the grid of the arms (cells <method>-<arm>)")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    st = _study()
    table: dict[str, Any] = {}
    defaults: dict[str, Any] = {}  # the batch-32 defaults' exits, read from the first paired study of each method
    for arm, what in ARMS.items():
        cells = [f"{m}-{arm}" for m in METHODS]
        if not any(finished(a.arms, c) for c in cells):
            continue
        out = a.out / arm
        argv_ = [str(a.arms), "--cells", *cells, "--reference", f"replaid-{arm}", "--against", f"mdlm-{arm}"]
        st.main([*argv_, "--budgets", *BUDGETS, "--out", str(out)])
        within = json.loads((out / "study.json").read_text())
        table[arm] = {"what": what, "methods": {}}
        # RePlaid (the recipe, the default) paired by seed against the same arm's MDLM
        argv_ = [str(a.arms), "--cells", *cells, "--reference", f"mdlm-{arm}", "--against", f"mdlm-{arm}"]
        st.main([*argv_, "--budgets", *BUDGETS, "--out", str(out / "against-mdlm")])
        against = json.loads((out / "against-mdlm" / "study.json").read_text())["cells"]
        for m, (base_cell, name) in METHODS.items():
            cell = f"{m}-{arm}"
            if cell not in within["cells"]:
                continue
            vs = out / f"vs-{m}"
            argv_ = [str(a.base), str(a.arms), "--cells", base_cell, cell, "--reference", base_cell]
            st.main([*argv_, "--against", base_cell, "--budgets", *BUDGETS, "--out", str(vs)])
            vs_cells = json.loads((vs / "study.json").read_text())["cells"]
            paired = vs_cells[cell].get("paired", {})
            base = vs_cells[base_cell]
            defaults.setdefault(m, {"name": name, "seeds": base["seeds"], "exit_steps": base["exit_steps"]})
            v = within["cells"][cell]
            table[arm]["methods"][m] = {
                "name": name,
                "seeds": v["seeds"],
                "exit_steps": v["exit_steps"],
                "exit_tokens": [within["runs"][cell][str(s)]["exit_tokens"] for s in v["seeds"]],
                "below_unigram_2400": v["below_unigram"].get("2400"),
                "offset_1200": v["offset"].get("1200"),
                "multiplier_2400": v["multiplier_interval"].get("2400"),
                "multipliers_2400": v["multiplier"].get("2400"),
                "minus_mdlm": {
                    "eval": against[cell].get("paired_eval") if m != "mdlm" else None,
                    "bound_diff_2400": (against[cell].get("paired") or {}).get("bound_diff", {}).get("2400")
                    if m != "mdlm"
                    else None,
                },
                "vs_defaults": {
                    "exit_diff_exact": paired.get("exit_diff_exact"),
                    "exit_diff_at_most": paired.get("exit_diff_at_most"),
                    "exit_diff": paired.get("exit_diff"),
                    "bound_diff_2400": (paired.get("bound_diff") or {}).get("2400"),
                },
            }
    # the defaults' RePlaid against their MDLM, paired by seed (the row the arms' last column is read against)
    base_cells = [c for c, _ in METHODS.values()]
    argv_ = [str(a.base), "--cells", *base_cells, "--reference", "mdlm", "--against", "mdlm", "--budgets", *BUDGETS]
    st.main([*argv_, "--out", str(a.out / "defaults-against-mdlm")])
    base_vs = json.loads((a.out / "defaults-against-mdlm" / "study.json").read_text())["cells"]
    for m, (c, _) in METHODS.items():
        if m in defaults:
            defaults[m]["minus_mdlm"] = {"eval": base_vs[c].get("paired_eval") if m != "mdlm" else None}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "arms.json").write_text(json.dumps({**table, "defaults": defaults}, indent=1, allow_nan=False))
    (a.out / "arms.md").write_text(markdown(table, st, defaults))
    plot({"defaults": {"what": "defaults (batch 32)", "methods": defaults}, **table}, a.out / "exits.png")
    print(f"wrote {a.out}/arms.json, arms.md, exits.png ({len(table)} arms)")
    return 0


def markdown(table: dict[str, Any], st: Any, defaults: dict[str, Any]) -> str:
    lines = [
        "Per arm and method, 3 seeds unless said: exit steps (- : still on the plateau at its last step), nats "
        "below the unigram bound at 2,400 steps, the offset above the same arm's MDLM at equal compute at 1,200 "
        "steps (at 2,400 it would need MDLM past its last step), MDLM's compute multiplier at 2,400 steps, and the exit and bound paired against the same method at the "
        "batch-32 defaults (backbone LR 1e-3, warm-up 100, hidden 128), and RePlaid's final test NELBO minus the same "
        "arm's MDLM, paired by seed. Intervals: 95% t over seeds, uncorrected.",
        "",
        "| arm | method | exit steps | below unigram at 2,400 | offset at 1,200 | multiplier at 2,400 | exit - defaults (steps) | bound - defaults at 2,400 | test NELBO - MDLM |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in table.values():
        for v in t["methods"].values():
            ex = ", ".join("-" if x is None else str(x) for x in v["exit_steps"])
            d = v["vs_defaults"]
            exact = ", ".join(f"{x:+d}" for x in d["exit_diff_exact"] or [])
            at_most = ", ".join(f"<= {x:+d}" for x in d["exit_diff_at_most"] or [])
            ed = (
                st.iv(d["exit_diff"], 0, True) if d["exit_diff"] else "; ".join(x for x in (exact, at_most) if x) or "-"
            )
            lines.append(
                f"| {t['what']} | {v['name']} | {ex} | {st.iv(v['below_unigram_2400'], 2)} | "
                f"{st.iv(v['offset_1200'], 3, True)} | {st.iv(v['multiplier_2400'], 2)} | {ed} | "
                f"{st.iv(d['bound_diff_2400'], 3, True)} | {st.iv(v['minus_mdlm']['eval'], 3, True)} |"
            )
    at = [
        f"{v['name']} {st.iv(v['minus_mdlm']['eval'], 3, True)}"
        for v in defaults.values()
        if v.get("minus_mdlm", {}).get("eval")
    ]
    if at:
        lines += ["", f"At the defaults, the final test NELBO minus MDLM's, paired by seed: {'; '.join(at)}."]
    return "\n".join(lines) + "\n"


def plot(table: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for i, t in enumerate(table.values()):
        for j, v in enumerate(t["methods"].values()):
            for s, x in zip(v["seeds"], v["exit_steps"], strict=True):
                y = 2500 if x is None else x  # still on the plateau: drawn above the axis' 2,400
                ax.scatter(
                    i + 0.22 * (j - 1) + 0.04 * (s - 1), y, color=f"C{j}", marker="^" if x is None else "o", s=22
                )
    ax.set_xticks(range(len(table)), [t["what"] for t in table.values()])
    ax.axhline(2400, color="k", lw=0.6, ls=":")
    ax.set_ylabel("exit step (triangle: still on the plateau at 2,400)")
    ax.set_title("Plateau exit per arm (batch 32, linux-docs, 3 seeds)", fontsize=10)
    from matplotlib.lines import Line2D

    names = [v["name"] for v in next(iter(table.values()))["methods"].values()]
    handles = [Line2D([], [], color=f"C{j}", marker="o", ls="", label=n) for j, n in enumerate(names)]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside: no point hidden
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
