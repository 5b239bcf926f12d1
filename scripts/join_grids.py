"""Join cells of several committed grids into one grid folder, so that one ``replaid grid trend`` or
``replaid grid report`` pairs them by seed.

Used for issue 39 §4: the block-size grid runs B = 4 and B = 16, and its B = seq_len cells are the gap2
grid's runs (the same recipe; B = seq_len is today's model bit for bit). Each ``--cell
GRID:CELL[=NEW]`` copies that cell's run folders' small files (``config.json``, ``metrics.jsonl``,
``final_eval.json``, the log and the resolved config; never checkpoints) under the new name. The seeds
must be the same in every cell; ``joined_from.json`` records where each cell came from.

    python scripts/join_grids.py --out docs/results/blocks/bsize/replaid \\
        --cell docs/results/blocks/bsize/h200:replaid-b4 --cell docs/results/blocks/bsize/h200:replaid-b16 \\
        --cell docs/results/trend/gap2/h100:replaid=replaid-b64 --reference replaid-b64
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import asdict, replace
from pathlib import Path

from replaid.config import ConfigError
from replaid.scaling.grid import read_grid

SMALL = ("config.json", "metrics.jsonl", "final_eval.json")


def fail(msg: str) -> None:
    print(f"replaid: error: {msg}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cell", action="append", required=True, help="GRID:CELL or GRID:CELL=NEWNAME (repeat)")
    ap.add_argument("--out", type=Path, required=True, help="a new folder for the joined grid")
    ap.add_argument("--reference", required=True, help="the joined grid's reference cell (a new name)")
    ap.add_argument("--ordering", action="append", default=[], help="'a < b' claims of the joined grid (repeat)")
    a = ap.parse_args(argv)
    if a.out.exists() and any(a.out.iterdir()):
        fail(f"--out {a.out} is not empty; choose a new folder (a joined grid is never written over)")
    entries, cells, origin, spec0, seeds = [], {}, {}, None, None
    for arg in a.cell:
        grid, sep, rest = arg.rpartition(":")
        if not sep:
            fail(f"--cell {arg!r} is not GRID:CELL[=NEW]; e.g. docs/results/trend/gap2/h100:replaid=replaid-b64")
        old, _, new = rest.partition("=")
        new = new or old
        try:
            spec, grid_entries = read_grid(Path(grid))
        except ConfigError as e:
            fail(f"--cell {arg!r}: {e}")
        if old not in spec.cells:
            fail(f"--cell {arg!r}: {grid} has no cell {old!r}; it has {', '.join(spec.cells)}")
        if new in cells:
            fail(f"--cell {arg!r}: the cell name {new!r} is taken; rename it with =NEW")
        mine = sorted((e for e in grid_entries if e.cell == old), key=lambda e: e.seed)
        if seeds is None:
            seeds, spec0 = [e.seed for e in mine], spec
        elif [e.seed for e in mine] != seeds:
            fail(f"--cell {arg!r}: seeds {[e.seed for e in mine]} differ from the first cell's {seeds}")
        cells[new], origin[new] = spec.cells[old], f"{grid}:{old}"
        for e in mine:
            nid = f"{new}__s{e.seed}"
            ne = replace(e, id=nid, cell=new, run_dir=f"runs/{nid}", config=f"configs/{nid}.json")
            src, dst = Path(grid), a.out
            (dst / ne.run_dir).mkdir(parents=True)
            (dst / "configs").mkdir(exist_ok=True)
            (dst / "logs").mkdir(exist_ok=True)
            for f in SMALL:
                if (src / e.run_dir / f).is_file():
                    shutil.copyfile(src / e.run_dir / f, dst / ne.run_dir / f)
            shutil.copyfile(src / e.config, dst / ne.config)
            if (src / "logs" / f"{e.id}.log").is_file():
                shutil.copyfile(src / "logs" / f"{e.id}.log", dst / "logs" / f"{nid}.log")
            entries.append(ne)
    if a.reference not in cells:
        fail(f"--reference {a.reference!r} is none of the joined cells ({', '.join(cells)})")
    assert spec0 is not None
    spec_d = spec0.to_dict()
    spec_d.update(cells=cells, reference=a.reference, orderings=a.ordering, vary={})
    (a.out / "spec.json").write_text(json.dumps(spec_d, indent=1))
    (a.out / "joined_from.json").write_text(json.dumps(origin, indent=1))
    man = {"version": 1, "kind": "grid", "runs": [asdict(e) for e in entries]}
    (a.out / "manifest.json").write_text(json.dumps(man, indent=1))
    read_grid(a.out)  # the joined grid reads back as a grid
    print(f"{a.out}: {len(cells)} cells x {len(seeds or [])} seeds from {len(set(origin.values()))} cells")


if __name__ == "__main__":
    main()
