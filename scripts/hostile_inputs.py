"""Run every case of the hostile-input table (``tests/test_bad_inputs.py``) on a 2-step debug run and
print it as Markdown (docs/results/robustness/README.md): command, damage, exit status, the last stderr
line, whether every file stayed byte-identical, and the counts (cases, tracebacks).

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python scripts/hostile_inputs.py > table.md
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]


def main() -> int:
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("REPLAID_CACHE_DIR", str(Path(tmp) / "cache"))
        import test_bad_inputs as t

        trained = Path(tmp) / "trained"
        argv = ["train", "--preset", "debug", "--out", str(trained), "--no-progress", "train.steps=2"]
        assert t.main([*argv, "eval.max_batches=1"]) == 0
        print("| # | command | damage | exit | stderr (last line) | one line | files unchanged |")
        print("|---|---|---|---|---|---|---|")
        t0, bad, tracebacks = time.time(), 0, 0
        for i, (args, needle, damage) in enumerate(t.CASES, 1):
            case = Path(tempfile.mkdtemp(dir=tmp))
            code, err, unchanged = t.run_case(trained, case, args, damage)
            last = (err[-1] if err else "").replace(str(case), "TMP").replace("|", "\\|")
            one = [ln for ln in err if ln.startswith("replaid: error:")] == err[-1:] and needle in last
            tracebacks += any("Traceback" in ln for ln in err)
            bad += not (code == 2 and one and unchanged)
            cmd = " ".join(args).replace("{run}", "RUN").replace("{tmp}", "TMP").replace("{new}", "NEW")
            name = getattr(damage, "__qualname__", "").split(".")[0] if damage else ""
            print(f"| {i} | `replaid {cmd[:90]}` | {name} | {code} | {last[:300]} | {one} | {unchanged} |")
        print(
            f"\n{len(t.CASES)} cases, {bad} not one line + exit 2 + files unchanged, {tracebacks} tracebacks "
            f"({time.time() - t0:.0f} s)"
        )
    return 1 if bad or tracebacks else 0


if __name__ == "__main__":
    sys.exit(main())
