"""Block diffusion speed and memory (issue 39 §4): time to first block, tokens/s and peak memory of
block-by-block generation (MDLM, RePlaid, Plaid with blocks of b tokens) against AR with its KV cache and
full-sequence diffusion at the same number of denoising steps per position, every family through the one
block loop that ``replaid sample`` and ``replaid serve`` run (:mod:`replaid.sampling.loop`,
``sample_any_length``: a ``BlockBatch`` of one lane).

    python benchmarks/bench_blocks.py                                   # demo size, CPU, batch 1 and 16
    python benchmarks/bench_blocks.py --device cuda --batches 1 16 --out bench_blocks
    python benchmarks/bench_blocks.py --run runs/demo-bd --steps 16     # a trained block run (its b, method)
    python benchmarks/bench_blocks.py --quick --out /tmp/bb             # debug size, seconds (the test's)

What is measured, per configuration (batch B, length N = k x seq_len for k in ``--lengths``):

- a prompt of P tokens (``--prompt``, random ids) is followed by n = N - P generated tokens, so every
  family writes the same n tokens per row; tokens/s = B x n / the seconds of the whole generation;
- **blocks** (``--methods``, ``--block-sizes``, ``--steps`` T per block): ``sample_any_length`` with its
  KV cache; past seq_len (k > 1) the sliding window keeps W = seq_len - b committed rows, so a block
  attends to W + b = seq_len keys (what the model was trained on). Time to first block: from the call
  to the first generated block's final ids (``on_block``), the prompt's prefill included;
- **ar**: a causal model of the same backbone with its KV cache, as blocks of one token (``sample_ar``'s
  draws: one call per token, the BOS + prompt prefilled in one call; past seq_len a window of seq_len - 1
  rows: seq_len keys). Time to first block: to the first b
  generated tokens, for each b of the sweep (``ttfb_by_block``);
- **full**: the same method without blocks writes seq_len positions per sample with T_full steps; it
  writes the n tokens as k samples, the first prompted (P kept), the others from nothing (it cannot see
  past seq_len). NFE matching: T_full = T x seq_len / b, so both make T / b denoising steps per
  position (``steps_per_position``); the block model adds one commit pass per block (1 / b per token),
  counted in its measured NFE. Time to first block: to the end of the first sample.

Peak memory: on CPU the rise of the process's resident-set high-water mark over the first whole
generation, each configuration in a fresh subprocess (``/proc/self/clear_refs`` resets the mark once
the model is built; VmHWM - VmRSS; without it, the ``ru_maxrss`` rise; the libraries' lazily made
buffers are in it, alike for every row; full-sequence rows: their first sample, as every sample is
alike); that run is the warm-up, a second one is timed. On CUDA a
short warm-up, then one run timed with ``torch.cuda.max_memory_allocated`` over the bytes allocated
before it. The output says which (``mem_kind``). ``--in-process`` runs every configuration in this
process: faster, but memory freed by an earlier one is reused unseen (a small row may read 0). Weights do not change the cost: the
preset's models are untrained (``--run``: the run's weights for the block rows, untrained baselines of
its config). Writes ``OUT/bench_blocks.json`` (meta + all rows) and ``OUT/bench_blocks.md``; ``--record``
also appends the table to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import append_results, device_name, run_isolated, sync

BLOCK_KEY = {"mdlm": "mdlm.block_size", "replaid": "diffusion.block_size", "plaid": "diffusion.block_size"}
MATCHING = (
    "full-sequence diffusion: T_full = T x seq_len / b steps per sample of seq_len positions, the block "
    "model's T steps per block of b positions: T / b denoising steps per position for both "
    "(steps_per_position); the block model adds one commit pass per block (1 / b per token), counted in "
    "its measured nfe. AR: one network call per token."
)
QUICK = dict(
    preset="debug",
    methods=["mdlm", "replaid"],
    block_sizes=[4, 8],
    steps=[4],
    batches=[1, 2],
    lengths=[1, 2],
    prompt=8,
)


def matched_full_steps(T: int, b: int, L: int) -> int:
    """The full-sequence diffusion's steps per sample of L positions that match T steps per block of
    b positions (T / b per position)."""
    if (T * L) % b:
        raise ValueError(f"T x seq_len / b = {T} x {L} / {b} is not a whole number of steps")
    return T * L // b


# ------------------------------------------------------------------ memory


class PeakMemory:
    """The peak memory a piece of work adds: CUDA's max allocated bytes, or the CPU process's RSS
    high-water mark (reset through /proc/self/clear_refs where the kernel allows it)."""

    def __init__(self, dev: torch.device):
        self.dev = dev
        self.kind = "cuda max_memory_allocated delta"
        self.base = 0

    @staticmethod
    def _status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise KeyError(key)

    def start(self) -> None:
        if self.dev.type == "cuda":
            sync(self.dev)
            torch.cuda.reset_peak_memory_stats(self.dev)
            self.base = torch.cuda.memory_allocated(self.dev)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            self.base = self._status("VmRSS")
            self.kind = "cpu rss high-water mark delta (VmHWM reset)"
        except OSError:
            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.kind = "cpu ru_maxrss delta"

    def stop(self) -> int:
        if self.dev.type == "cuda":
            sync(self.dev)
            return int(torch.cuda.max_memory_allocated(self.dev) - self.base)
        # The kernel folds freed pages into the high-water mark lazily: pages the allocator hands back
        # (madvise) after the reset can leave VmHWM a few pages below the RSS read as the base. Work that
        # adds less than that reads slightly negative (-200 KiB seen at --tiny): it added nothing measurable.
        if "VmHWM" in self.kind:
            return max(0, self._status("VmHWM") - self.base)
        return max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base)


# ------------------------------------------------------------------ the three families


def build(spec: dict, family: str, dev: torch.device):
    """(method, model, seq_len, vocab) for ``family``: the block run (the preset with ``b``, or
    ``--run``'s), or its baseline of the same backbone: full sequence (no blocks) or AR."""
    import copy

    from replaid.config import set_key
    from replaid.methods import get_method
    from replaid.presets import resolve
    from replaid.training.memory import preset_vocab

    m = spec["method"]
    if spec.get("run"):
        from replaid.store.loading import load_run

        run = load_run(spec["run"], device=str(dev))
        if family == "blocks":
            return run.method, run.model.eval(), run.cfg.data.seq_len, run.data.vocab_size
        cfg, V = copy.deepcopy(run.cfg), run.data.vocab_size
        if family == "ar":
            set_key(cfg, "method", "ar")
        else:
            set_key(cfg, BLOCK_KEY[cfg.method], 0)
        cfg.validate()
    else:
        over = {"blocks": [f"method={m}", f"{BLOCK_KEY.get(m, 'x')}={spec.get('b')}"], "full": [f"method={m}"]}
        cfg = resolve(spec["preset"], None, over.get(family, ["method=ar"]))
        V = spec.get("vocab") or preset_vocab(cfg)
    method = get_method(cfg)
    torch.manual_seed(0)
    return method, method.build_model(V).to(dev).eval(), cfg.data.seq_len, V


def gen_blocks(method, model, prompt, n: int, T: int, window: int | None, sampler, dev) -> dict:
    from replaid.sampling.loop import sample_any_length

    g = torch.Generator().manual_seed(0)
    first: list[float] = []
    sync(dev)
    t0 = time.perf_counter()

    def on_block(k: int, ids: torch.Tensor) -> None:
        if not first:
            sync(dev)
            first.append(time.perf_counter() - t0)

    res = sample_any_length(
        method, model, prompt, n, sampler=sampler, steps=T, window=window, generator=g, on_block=on_block
    )
    sync(dev)
    secs = time.perf_counter() - t0
    if res.tokens.shape[1] < prompt.shape[1] + n:
        raise RuntimeError(f"wrote {res.tokens.shape[1]} positions, not {prompt.shape[1] + n}")
    return {"seconds": secs, "ttfb_s": first[0], "nfe": res.nfe}


def gen_full(method, model, prompt, n: int, L: int, T: int, sampler, dev) -> dict:
    """n = k L - P tokens as k samples of L positions: the first prompted, the rest from nothing."""
    from replaid.sampling.loop import sample_any_length

    g = torch.Generator().manual_seed(0)
    P = prompt.shape[1]
    k = (n + P) // L
    nfe, first = 0, 0.0
    sync(dev)
    t0 = time.perf_counter()
    for i in range(k):
        p = prompt if i == 0 else prompt[:, :0]
        res = sample_any_length(method, model, p, L - p.shape[1], sampler=sampler, steps=T, generator=g)
        nfe += res.nfe
        if i == 0:
            sync(dev)
            first = time.perf_counter() - t0
    sync(dev)
    return {"seconds": time.perf_counter() - t0, "ttfb_s": first, "nfe": nfe, "samples": k}


def gen_ar(method, model, prompt, n: int, window: int | None, blocks: list[int], dev) -> dict:
    """AR through the one block loop (blocks of one token over its KV cache, the path ``replaid serve`` and
    ``replaid sample`` run: ``sample_ar``'s draws); the time to the first b tokens for each b in ``blocks``."""
    from replaid.sampling.loop import sample_any_length

    g = torch.Generator().manual_seed(0)
    P = prompt.shape[1]
    ttfb: dict[str, float] = {}
    sync(dev)
    t0 = time.perf_counter()

    def on_block(k: int, ids: torch.Tensor) -> None:
        if k + 1 - P in blocks:
            sync(dev)
            ttfb[str(k + 1 - P)] = time.perf_counter() - t0

    res = sample_any_length(method, model, prompt, n, window=window, generator=g, on_block=on_block)
    sync(dev)
    return {
        "seconds": time.perf_counter() - t0,
        "ttfb_by_block": ttfb,
        "ttfb_s": ttfb[str(min(blocks))],
        "nfe": res.nfe,
        "tokens_out": res.tokens[:, P:],
    }


def one(**spec: Any) -> dict:
    """One configuration, measured in this process (the child of ``--one``): build, then the peak
    memory and the time of a generation (module docstring)."""
    dev = torch.device(spec["device"])
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    fam, B, P, k = spec["family"], spec["batch"], spec["prompt"], spec["length_x"]
    method, model, L, V = build(spec, fam, dev)
    if P >= L:
        raise ValueError(f"the prompt ({P}) must be shorter than seq_len ({L})")
    n = k * L - P
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, V, (B, P), generator=g).to(dev)
    ctx = (
        torch.autocast("cuda", torch.bfloat16)
        if dev.type == "cuda" and spec.get("autocast", True)
        else torch.autocast("cpu", enabled=False)
    )
    b = (method.stream_block() or L) if fam == "blocks" else spec.get("b")
    mem = PeakMemory(dev)
    with torch.no_grad(), ctx:
        if fam == "blocks":
            window = None if k == 1 else L - b
            gen = lambda nn: gen_blocks(method, model, prompt, nn, spec["steps"], window, spec.get("sampler"), dev)
            warm = b
        elif fam == "full":
            window = None
            gen = lambda nn: gen_full(method, model, prompt, nn, L, spec["steps"], spec.get("sampler"), dev)
            warm = L - P
        else:
            window = None if k == 1 else L - 1
            blocks = [x for x in spec["blocks"] if x <= n]
            gen = lambda nn: gen_ar(method, model, prompt, nn, window, blocks if nn == n else [min(blocks)], dev)
            warm = min(blocks)
        if dev.type == "cuda":  # allocated bytes are exact: warm up, then one run for time and memory
            gen(warm)
            mem.start()
            r = gen(n)
            peak = mem.stop()
        else:  # the resident set: the first run (nothing freed before it to reuse), then the timed one
            mem.start()
            gen(L - P if fam == "full" else n)  # full: its samples are alike, the first one's peak is theirs
            peak = mem.stop()
            r = gen(n)
    r.pop("tokens_out", None)
    span = None if window is None else window + (1 if fam == "ar" else b)
    row = {
        **{x: spec.get(x) for x in ("family", "method", "batch", "length_x", "prompt", "steps", "matched_steps")},
        "block": {"blocks": b, "full": L}.get(fam),  # positions per network call's denoised piece
        "seq_len": L,
        "vocab": V,
        "tokens": n,
        "window": window,
        "attention_span": span if span is not None else L,
        **r,
        "nfe_per_token": r["nfe"] / n,
        "tokens_per_s": B * n / r["seconds"],
        "peak_mem_bytes": peak,
        "mem_kind": mem.kind,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
    }
    if fam == "ar":
        row["method"], row["steps_per_position"] = "ar", 1.0
    elif fam == "blocks":
        row["steps_per_position"] = spec["steps"] / b
        row["method"] = method.name
    else:
        row["steps_per_position"] = spec["steps"] / L
        row["matched_block"] = spec["b"]
    return row


# ------------------------------------------------------------------ the sweep


def plan(a) -> list[dict]:
    """Every configuration's spec, in the order measured (``b`` of a full row: the block size it matches)."""
    specs: list[dict] = []
    base = dict(preset=a.preset, run=a.run, device=a.device, vocab=a.vocab, prompt=a.prompt, threads=a.threads)
    base["autocast"] = not a.no_autocast
    base["sampler"] = a.sampler
    for B in a.batches:
        for k in a.lengths:
            common = dict(base, batch=B, length_x=k)
            specs.append(dict(common, family="ar", method="ar", blocks=sorted(a.block_sizes)))
            for m in a.methods:
                for b in a.block_sizes:
                    for T in a.steps:
                        specs.append(dict(common, family="blocks", method=m, b=b, steps=T))
                        Tf = matched_full_steps(T, b, a.seq_len)
                        specs.append(dict(common, family="full", method=m, b=b, steps=Tf, matched_steps=T))
    return specs


def measure(specs: list[dict], in_process: bool) -> list[dict]:
    rows = []
    for s in specs:
        label = f"{s['family']:6s} {s['method']:8s} b={s.get('b', '-')!s:>3} T={s.get('steps', '-')!s:>4} B={s['batch']:3d} {s['length_x']}x"
        try:
            if in_process:
                row, err = one(**s), ""
            else:
                row, err = run_isolated(__file__, s, {**os.environ})
        except Exception as e:  # in process: the row says why
            row, err = None, f"{type(e).__name__}: {e}"
        if row is None:
            msg = (err.strip().splitlines() or ["?"])[-1]
            print(f"{label}: failed: {msg}", flush=True)
            rows.append({**{x: s.get(x) for x in ("family", "method", "batch", "length_x", "steps")}, "error": msg})
            continue
        print(
            f"{label}: {row['seconds']:7.2f}s  first block {row['ttfb_s']:6.3f}s  {row['tokens_per_s']:9.1f} tok/s  "
            f"nfe {row['nfe']:5d}  peak +{row['peak_mem_bytes'] / 2**20:.1f} MiB",
            flush=True,
        )
        rows.append(row)
    return rows


def expected_keys(meta: dict) -> list[tuple]:
    keys: list[tuple] = []
    for B in meta["batches"]:
        for k in meta["lengths"]:
            keys.append(("ar", "ar", None, None, B, k))
            for m in meta["methods"]:
                for b in meta["block_sizes"]:
                    for T in meta["steps"]:
                        keys += [("blocks", m, b, T, B, k), ("full", m, b, T, B, k)]
    return keys


def row_key(r: dict) -> tuple:
    if r["family"] == "ar":
        return ("ar", "ar", None, None, r["batch"], r["length_x"])
    if r["family"] == "full":
        return ("full", r["method"], r.get("matched_block"), r.get("matched_steps"), r["batch"], r["length_x"])
    return ("blocks", r["method"], r.get("block"), r.get("steps"), r["batch"], r["length_x"])


def check_rows(rows: list[dict], meta: dict) -> list[str]:
    """What is wrong with a sweep's rows (empty: all good): every configuration present, without error,
    tokens/s and memory > 0 (>= 0 in one process), the tokens asked for, NFE matched as stated (T_full x b = T x seq_len) and
    as the samplers count it."""
    from replaid.methods.base import Kind
    from replaid.sampling.registry import REGISTRY

    bad: list[str] = []
    L, P = meta["seq_len"], meta["prompt"]
    by = {row_key(r): r for r in rows if "error" not in r}
    bad += [f"{row_key(r)}: {r['error']}" for r in rows if "error" in r]
    bad += [f"missing {k}" for k in expected_keys(meta) if k not in by]
    kinds = {"mdlm": Kind.MASKED, "replaid": Kind.CONTINUOUS, "plaid": Kind.CONTINUOUS}
    for key, r in by.items():
        fam, m, b, T, B, k = key
        n = k * L - P
        if r["tokens"] != n:
            bad.append(f"{key}: {r['tokens']} tokens, not {n}")
        for f in ("tokens_per_s", "peak_mem_bytes", "ttfb_s", "nfe"):
            if not (r.get(f, -1) >= 0 if f == "peak_mem_bytes" and not meta["isolated"] else r.get(f, 0) > 0):
                bad.append(f"{key}: {f} = {r.get(f)}")
        if not r["ttfb_s"] <= r["seconds"]:
            bad.append(f"{key}: time to first block {r['ttfb_s']} > the whole generation {r['seconds']}")
        if fam == "ar":
            if r["nfe"] != n:
                bad.append(f"{key}: AR made {r['nfe']} calls for {n} tokens")
            if sorted(map(int, r["ttfb_by_block"])) != sorted(b for b in meta["block_sizes"] if b <= n):
                bad.append(f"{key}: AR's times to first block are for {sorted(r['ttfb_by_block'])}")
            continue
        name = meta["sampler"] or ("ancestral" if m == "mdlm" else "ddpm")
        smp = REGISTRY[kinds[m], name]
        if fam == "blocks":
            gen_blocks_, all_blocks = n // b, k * L // b
            bound = gen_blocks_ * smp.nfe(T) + all_blocks - 1  # each written block's T steps + the commits
            if r["block"] != b or r["steps_per_position"] != T / b:
                bad.append(f"{key}: block {r['block']}, {r['steps_per_position']} steps per position")
        else:
            if r["steps"] * b != T * L:
                bad.append(f"{key}: NFE not matched: T_full = {r['steps']}, want T x seq_len / b = {T * L / b}")
            blk = by.get(("blocks", m, b, T, B, k))
            if blk is not None and r["steps_per_position"] != blk["steps_per_position"]:
                bad.append(
                    f"{key}: {r['steps_per_position']} steps per position, the block row {blk['steps_per_position']}"
                )
            bound = k * smp.nfe(r["steps"])
        if r["nfe"] > bound or (smp.nfe_exact and r["nfe"] != bound):
            bad.append(f"{key}: nfe {r['nfe']}, the sampler's count {'' if smp.nfe_exact else '<= '}{bound}")
    return bad


def markdown(rows: list[dict], meta: dict) -> tuple[list[str], list[list]]:
    header = ["family", "method", "b", "T", "steps/pos", "batch", "N", "tokens", "window", "NFE", "NFE/token",
              "first block s", "tokens/s", "peak MiB"]  # fmt: skip
    table = []
    for r in rows:
        if "error" in r:
            table.append(
                [
                    r["family"],
                    r["method"],
                    "",
                    r.get("steps"),
                    "",
                    r["batch"],
                    f"{r['length_x']}x",
                    "",
                    "",
                    "",
                    "",
                    "failed",
                    "",
                    r["error"][:60],
                ]
            )
            continue
        b = r.get("matched_block") if r["family"] == "full" else r.get("block")
        first = (
            ", ".join(f"{kb}: {v:.3g}" for kb, v in r["ttfb_by_block"].items())
            if r["family"] == "ar"
            else f"{r['ttfb_s']:.3g}"
        )
        T = r.get("steps") if r["family"] != "full" else f"{r['steps']} (= {r['matched_steps']} x {r['seq_len']}/{b})"
        table.append(
            [
                r["family"],
                r["method"],
                b if b is not None else "-",
                T if T is not None else "-",
                f"{r['steps_per_position']:.3g}",
                r["batch"],
                f"{r['length_x']}x",
                r["tokens"],
                r["window"] if r["window"] is not None else "-",
                r["nfe"],
                f"{r['nfe_per_token']:.3g}",
                first,
                f"{r['tokens_per_s']:.4g}",
                f"{r['peak_mem_bytes'] / 2**20:.1f}",
            ]
        )
    return header, table


def write_markdown(path: Path, meta: dict, header: list[str], table: list[list]) -> None:
    lines = [
        f"# Block diffusion speed and memory — {meta['date']} — {meta['device']}",
        "",
        f"`{meta['command']}`; torch {meta['torch']}, {meta['threads']} threads, preset {meta['preset']}"
        f"{', run ' + meta['run'] if meta['run'] else ''}, prompt {meta['prompt']} tokens, seq_len {meta['seq_len']}.",
        "",
        f"NFE matching: {meta['nfe_matching']} Peak memory: {meta['mem_kind']}. First block: {meta['ttfb']}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *["| " + " | ".join(str(x) for x in r) + " |" for r in table],
    ]
    path.write_text("\n".join(lines) + "\n")


def build_parser() -> argparse.ArgumentParser:
    """The options (the GPU check's dry run parses its command with them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="demo")
    p.add_argument(
        "--run", default=None, help="a trained block run: its method and b (--methods, --block-sizes ignored)"
    )
    p.add_argument("--methods", nargs="+", default=["mdlm", "replaid"], choices=sorted(BLOCK_KEY))
    p.add_argument("--block-sizes", type=int, nargs="+", default=[4, 16])
    p.add_argument("--steps", type=int, nargs="+", default=[16], help="T, steps per block")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--lengths", type=int, nargs="+", default=[1, 4, 8], help="N = k x seq_len, prompt included")
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens (random ids)")
    p.add_argument("--sampler", default=None, help="the continuous methods' sampler (default: the method's, ddpm)")
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in each configuration")
    p.add_argument("--no-autocast", action="store_true", help="on CUDA: float32 (default: bf16 autocast)")
    p.add_argument("--in-process", action="store_true", help="every configuration in this process (memory less clean)")
    p.add_argument("--quick", action="store_true", help=f"the test's small sweep: defaults {QUICK}")
    p.add_argument("--out", default="bench_blocks", help="folder for bench_blocks.json and bench_blocks.md")
    p.add_argument("--record", action="store_true", help="also append the table to docs/benchmarks.md")
    p.add_argument("--json", action="store_true", help="print the record as one JSON line, last (the GPU check's)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    if "--quick" in (argv if argv is not None else sys.argv[1:]):
        p.set_defaults(**QUICK)  # the quick sweep's sizes; flags given still win
    a = p.parse_args(argv)
    if a.one:  # the child: one configuration, one JSON line
        print(json.dumps(one(**json.loads(a.one))))
        return 0
    if a.run:
        from replaid.store.loading import load_run

        r = load_run(a.run, device=a.device)
        L = r.cfg.data.seq_len
        a.methods, a.block_sizes, a.seq_len = [r.method.name], [r.method.stream_block() or L], L
        del r
    else:
        from replaid.presets import get_preset

        a.seq_len = get_preset(a.preset).data.seq_len
    specs = plan(a)
    print(f"{len(specs)} configurations", flush=True)
    rows = measure(specs, a.in_process)
    ok = [r for r in rows if "error" not in r]
    dev = torch.device(a.device)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": device_name(dev) if dev.type == "cuda" else f"CPU {platform.processor() or platform.machine()}",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": a.threads or torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "preset": a.preset if not a.run else None,
        "run": a.run,
        "seq_len": a.seq_len,
        "prompt": a.prompt,
        "methods": a.methods,
        "block_sizes": a.block_sizes,
        "steps": a.steps,
        "batches": a.batches,
        "lengths": a.lengths,
        "sampler": a.sampler,
        "autocast": "bf16" if dev.type == "cuda" and not a.no_autocast else "off (float32)",
        "isolated": not a.in_process,
        "mem_kind": ok[0]["mem_kind"] if ok else None,
        "nfe_matching": MATCHING,
        "ttfb": "blocks: the prompt's prefill + the first generated block's final ids; AR: the first b tokens; "
        "full: the first sample of seq_len.",
        "window": "k > 1: blocks keep seq_len - b committed rows, AR seq_len - 1 (seq_len keys either way)",
        "command": "python benchmarks/bench_blocks.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    problems = check_rows(rows, meta)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_blocks.json").write_text(json.dumps({"meta": meta, "rows": rows, "problems": problems}, indent=1))
    header, table = markdown(rows, meta)
    write_markdown(out / "bench_blocks.md", meta, header, table)
    print(f"wrote {out / 'bench_blocks.json'} and {out / 'bench_blocks.md'}", flush=True)
    for msg in problems:
        print("problem:", msg, file=sys.stderr, flush=True)  # on stderr: the GPU check records it
    if a.json:
        print(json.dumps({"meta": meta, "rows": rows, "problems": problems, "ok": not problems}), flush=True)
    if a.record and ok:
        append_results(
            f"Block diffusion speed and memory, {meta['device']}",
            header,
            table,
            f"`{meta['command']}`; torch {meta['torch']}. NFE matching: {MATCHING} Peak memory: {meta['mem_kind']}.",
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
