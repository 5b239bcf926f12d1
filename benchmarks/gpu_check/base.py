"""What every part of the GPU check shares: paths, the measured sizes and methods, bad input, the log line."""

from __future__ import annotations

import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
PRESET, L_PAPER = "owt-0.1b", 1024
SPEED_METHODS = ["ar", "mdlm", "replaid"]
ALL_METHODS = ["replaid", "plaid", "mdlm", "duo", "ar"]
# preset of each method at the paper's 0.1B size (plaid and duo have their own published set-ups)
PRESET_OF = {
    "replaid": (PRESET, []),
    "ar": (PRESET, ["method=ar"]),
    "mdlm": (PRESET, ["method=mdlm"]),
    "plaid": ("owt-0.1b-plaid", []),
    "duo": ("owt-0.1b-duo", []),
}


class UsageError(Exception):
    """Bad input: one ``replaid: error:`` line, exit status 2."""


def log(msg: str) -> None:
    print(f"[gpu_check {datetime.datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)
