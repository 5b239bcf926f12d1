"""replaid: likelihood-based continuous diffusion language models (RePlaid) and baselines."""

__version__ = "0.1.0"
