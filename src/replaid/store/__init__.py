"""The run store: what a run folder holds and how it is read and written, below the trainer.

``checkpoint`` (the checkpoint folders, their sha256 record and identity), ``sharded`` (FSDP's distributed
checkpoints), ``runfolder`` (the run folder's files: config, final evaluation, the interrupted-run marker),
``metrics_log`` (``metrics.jsonl`` and the trackers) and ``loading`` (a trained run loaded for evaluation,
sampling, serving and export). Nothing here imports the training loop (``replaid.training``): inference
loads a run through this package alone.
"""
