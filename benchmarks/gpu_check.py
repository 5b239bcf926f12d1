"""The entry point of the GPU check (``scripts/gpu_check.sh`` runs it; the code is the package
``benchmarks/gpu_check/``, whose docstring describes the steps):

    python benchmarks/gpu_check.py --quick --out $OUT
    python benchmarks/gpu_check.py --dry-run
    python benchmarks/gpu_check.py --child NAME --spec JSON   # one step's measurement, in its own process

Run as a script, ``benchmarks/`` is first on ``sys.path`` and ``import gpu_check`` finds the package
(a package directory wins over a module of the same name), not this file.
"""

import sys

from gpu_check.cli import main

if __name__ == "__main__":
    sys.exit(main())
