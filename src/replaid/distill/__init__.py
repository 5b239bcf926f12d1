"""Few-step generation: progressive and consistency distillation of RePlaid's PF-ODE
(``replaid distill``; the maths in :mod:`replaid.distill.targets`, the loop in :mod:`replaid.distill.loop`)."""
