"""GPU acceptance in one command (issue 27): the driver behind ``scripts/gpu_check.sh``, run as
``python benchmarks/gpu_check.py`` (a thin entry point to this package).

    python benchmarks/gpu_check.py --quick --out $OUT                # what scripts/gpu_check.sh --quick runs
    python benchmarks/gpu_check.py --steps speed,speed_compiled     # a subset (a full check split over calls)
    python benchmarks/gpu_check.py --dry-run                         # the plan; every step's commands resolved
    python benchmarks/gpu_check.py --merge a/gpu_check.json b/gpu_check.json --out docs/gpu_check --record

Each step runs its commands in fresh processes (a clean CUDA allocator, one failure contained) and
writes its part into ``OUT/gpu_check.json`` as soon as it ends; ``OUT/gpu_check.md`` renders the
JSON as tables. A step that fails, times out or errors is recorded with its error and the next one
runs. ``--budget SECONDS`` (``--quick``: 570 s less the set-up time) skips the steps whose estimate no
longer fits, naming them, so a quick check ends inside one 10-minute device call. Steps:

  env             device, driver, torch/CUDA versions, bf16 matmul peak, torch features, dependencies
  tests           the gpu-marked tests + samplers, likelihood, method contract, compile with --device cuda
  bf16            bf16 autocast vs float32 on the same batch and noise, per method: loss and gradients
  syncs           host syncs per training step by CUDA's own sync debug mode, per method
  compile         the loss core under torch._dynamo.explain on CUDA (graphs, breaks); full: compiled = eager
  speed           tokens/s, MFU, step time, peak memory at owt-0.1b, L = 1024, batch 32: AR, MDLM, RePlaid
  speed_compiled  the same with train.compile=true
  memory          peak memory at two more batch sizes against ``replaid memory``'s model
  maxbatch        the largest batch that fits (out-of-memory search) against the model's prediction
  sampler         sampler NFE/s at V = 50,257 (RePlaid's samplers; MDLM's in full)
  likelihood      the ODE likelihood's time per sequence (Heun, owt-0.1b, L = 1024)
  mdlm_ref        the MDLM reference (kuleshov-group/mdlm in .carry/mdlm) step, beside replaid's MDLM
  blocks          block diffusion (issue 39 §4, benchmarks/bench_blocks.py): first block, tokens/s, peak
                  memory at batch 1 and 16 against AR with its cache and the full sequence (--quick: 8x only)
  blocks_01b      the same at owt-0.1b, 1x seq_len, blocks of 16, batch 1 and 16 (full check only)
  breakdown       one training step per method taken apart (issue 53 §1, benchmarks/bench_breakdown.py):
                  data, forward, backward, optimiser, the named regions (self-conditioning pass, loss terms,
                  output prior) and the bytes model of the fused heads
  serve           served completions under load (issue 52 §3): AR, MDLM and RePlaid at 1-64 clients (full only)
  bf16_train      RePlaid in bf16 autocast against fp32, 4,000 steps, 3 seeds each (issue 53 §3; full only,
                  linux-docs carried in .gl/, resumable across calls): divergence, gradient norms, bounds
  plateau_b512    the plateau's exit at batch 512 (issue 48 §2; full only, .gl/linux-docs, resumable): MDLM,
                  RePlaid and the recipe, 3 seeds, 600 steps; the runs' logs kept in OUT/plateau_b512/

Bad input ends in one line ``replaid: error: ...`` and exit status 2; otherwise the exit status is 0
when every step that ran passed, 1 when one failed.

The package (benchmarks/gpu_check/): ``base`` (paths, sizes, methods, bad input), ``children`` (what a
step measures in its own process: ``--child NAME --spec JSON``), ``plan`` (the step language: commands,
steps, the plan, ``--steps``), ``runner`` (the processes, the budget, the JSON as each step ends),
``report`` (the markdown, one renderer per step), ``record`` (``--merge``, ``--record``), ``dryrun``
(``--dry-run``) and ``cli`` (the options, ``main``). The set-ups and gradient comparisons it shares
with the tests are in ``replaid.training.testbed``.
"""
