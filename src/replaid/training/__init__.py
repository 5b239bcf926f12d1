"""Training machinery: the loop and train_step (``train``), the layout check, the memory and FLOP models, the
plateau signatures, classifier training and the test tools; the run folder it writes is :mod:`replaid.store`'s."""
