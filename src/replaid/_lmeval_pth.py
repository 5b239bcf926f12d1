"""Write ``replaid_lmeval.pth`` (the start-up line of ``replaid._lmeval_hook``) into a site-packages folder.

An installed wheel carries the file already (setup.py puts it at the wheel's top level, beside
``replaid/``), so ``pip install 'replaid[lmeval]'`` is enough for ``lm_eval --model replaid``. This
command is for the other environments: an editable install (``scripts/setup.sh`` runs it) or replaid on
``PYTHONPATH``::

    python -m replaid._lmeval_pth [SITE_PACKAGES]     # default: this interpreter's purelib

It is a module of its own, never imported at start-up: running ``python -m replaid._lmeval_hook`` where
the .pth line had already imported that module made Python warn (``RuntimeWarning: 'replaid._lmeval_hook'
found in sys.modules ...``) before every set-up.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

PTH = "replaid_lmeval.pth"
# the .pth line: a no-op when replaid is not importable (uninstalled), never an error at start-up
LINE = 'import importlib.util; importlib.util.find_spec("replaid") and __import__("replaid._lmeval_hook")\n'


def write(site: Path | None = None) -> Path:
    pth = Path(site or sysconfig.get_paths()["purelib"]) / PTH
    if not pth.exists() or pth.read_text() != LINE:
        pth.write_text(LINE)
    return pth


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    pth = write(Path(args[0]) if args else None)
    print(f"wrote {pth}: lm_eval --model replaid now works in this environment")
    return 0


if __name__ == "__main__":
    sys.exit(main())
