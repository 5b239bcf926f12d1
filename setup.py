"""The one thing pyproject.toml cannot say: the wheel also carries ``replaid_lmeval.pth`` at its top level.

pip installs that file into site-packages next to ``replaid/`` (and removes it on uninstall), so
``lm_eval --model replaid`` works wherever replaid is installed: the harness reads no entry points, and
the line (``LINE`` of ``src/replaid/_lmeval_pth.py``, read here without importing replaid) only adds
an import hook at start-up. Everything else is configured in pyproject.toml.
"""

from __future__ import annotations

import ast
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "replaid_lmeval.pth"
HOOK = Path(__file__).resolve().parent / "src" / "replaid" / "_lmeval_pth.py"


def pth_line() -> str:
    for node in ast.parse(HOOK.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LINE" for t in node.targets):
            return ast.literal_eval(node.value)
    raise RuntimeError(f"no LINE = ... in {HOOK}")


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        Path(self.build_lib).mkdir(parents=True, exist_ok=True)
        (Path(self.build_lib) / PTH).write_text(pth_line())

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
