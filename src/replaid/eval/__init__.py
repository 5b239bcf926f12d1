"""Evaluation: NELBO evaluation, ODE/IWAE likelihood, diagnostics, sample quality, sweeps, generation."""
