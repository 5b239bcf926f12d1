"""Training machinery: the loop and train_step, checkpoints, distributed glue, FLOPs, metrics."""
