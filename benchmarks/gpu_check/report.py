"""``gpu_check.md``: the JSON of a run (or of several merged calls) as dated tables, what
docs/benchmarks.md includes. :func:`render` writes the header (the run's facts and every step's
status) and then each step's part with that step's renderer in :data:`RENDERERS`.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import PRESET
from .plan import STEPS


def _f(x, fmt=".3g") -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return format(x, fmt)
    return str(x)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _table(header: list, rows: list) -> str:
    if not rows:
        return ""
    return (
        "\n".join(
            ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(_f(c) for c in r) + " |" for r in rows]
        )
        + "\n"
    )


def _data(doc: dict, step: str) -> list:
    return [r["data"] for r in (doc.get("steps", {}).get(step, {}).get("results") or []) if "data" in r]


def _env(doc: dict) -> dict:
    return next(iter(_data(doc, "env")), {})


def render(doc: dict) -> str:
    """``gpu_check.md``: the JSON as dated tables (what docs/benchmarks.md includes)."""
    return render_header(doc) + "".join(part(doc) for _, part in RENDERERS)


def render_header(doc: dict) -> str:
    """The title, the run's facts (dates, device, versions, set-up, the matmul peak) and each step's status."""
    runs = doc.get("runs") or [{}]
    env = _env(doc)
    setup = next((r.get("setup") for r in reversed(runs) if r.get("setup")), {}) or {}
    device = env.get("device") or setup.get("gpu") or "no GPU seen"
    date = (runs[0].get("started") or "")[:10]
    out = [f"### GPU check — {date} — {device}\n\n"]
    facts = [
        ("date(s)", ", ".join(sorted({(r.get("started") or "?")[:16] for r in runs}))),
        ("device", device),
        ("driver", setup.get("driver") or "-"),
        ("torch / CUDA", f"{env.get('torch') or runs[-1].get('torch')} / {env.get('cuda') or runs[-1].get('cuda')}"),
        ("Python", env.get("python") or runs[-1].get("python")),
        ("set-up time", ", ".join(f"{r['setup'].get('setup_seconds', '?')} s" for r in runs if r.get("setup")) or "-"),
        (
            "bf16 matmul peak (measured / datasheet)",
            f"{_f(env.get('matmul_bf16_tflops'))} / {_f(env.get('datasheet_bf16_tflops'))} TFLOP/s",
        ),
        ("modes", ", ".join(sorted({r.get("mode", "?") for r in runs}))),
    ]
    out.append(_table(["", ""], [[k, v] for k, v in facts]))
    rows = []
    for s in STEPS:
        st = doc.get("steps", {}).get(s.name)
        if st:
            rows.append(
                [
                    s.name,
                    st.get("status"),
                    _f(st.get("seconds"), ".0f"),
                    (st.get("error") or st.get("reason") or "")[:240].replace("|", "/"),
                ]
            )
    out.append("\n" + _table(["step", "status", "s", "note"], rows))
    return "".join(out)


def render_env(doc: dict) -> str:
    """The torch features the project needs (present or not) and the dependencies missing there."""
    env = _env(doc)
    feats = env.get("features") or []
    if not feats:
        return ""
    out = ["\n**torch features** (the first release that has each; 'present': in the torch measured)\n\n"]
    out.append(
        _table(
            ["API", "needs torch >=", "present", "used by"],
            [[f["api"], f["since"], f["present"], f["used_by"]] for f in feats],
        )
    )
    missing = [k for k, v in (env.get("dependencies") or {}).items() if not v]
    if missing:
        out.append(f"\nDependencies missing there (not needed by the check): {', '.join(missing)}\n")
    return "".join(out)


def render_tests(doc: dict) -> str:
    """The pytest counts and the failed tests (at most 20)."""
    out = []
    for r in doc.get("steps", {}).get("tests", {}).get("results") or []:
        if "tests" in r:
            out.append(
                f"\n**tests** (`pytest --device {r.get('device', 'cuda')}`: {', '.join(r.get('files', []))}): "
                f"{r['passed']} passed, {r['failures']} failed, {r['errors']} "
                f"errors, {r['skipped']} skipped in {_f(r.get('seconds'), '.0f')} s\n"
            )
            for f in r.get("failed", [])[:20]:
                out.append(f"- FAILED {f['test']}: {f['message'][:200]}\n")
    return "".join(out)


def render_bf16(doc: dict) -> str:
    """bf16 autocast against float32, per method: losses, gradient errors, the worst tensor."""
    out = []
    for d in _data(doc, "bf16")[:1]:
        th = d.get("thresholds", {})
        out.append(
            f"\n**bf16 autocast vs float32** (same batch, noise, dropout; batch x L as listed; thresholds: "
            f"loss {th.get('loss')}, gradient {th.get('grad')})\n\n"
        )
        out.append(
            _table(
                [
                    "method",
                    "B x L",
                    "loss fp32",
                    "loss bf16",
                    "loss rel err",
                    "grad rel err",
                    "median tensor",
                    "worst tensor",
                    "pass",
                ],
                [
                    [
                        m,
                        f"{r['batch']} x {r['L']}",
                        r["loss_fp32"],
                        r["loss_bf16"],
                        r["loss_rel_err"],
                        r["grad_rel_err"],
                        r["grad_rel_err_median_tensor"],
                        f"{r['grad_rel_err_worst_tensor'][0]} {_f(r['grad_rel_err_worst_tensor'][1])}",
                        r["ok"],
                    ]
                    for m, r in d.get("methods", {}).items()
                ],
            )
        )
    return "".join(out)


def render_syncs(doc: dict) -> str:
    """Host syncs per training step, per method, with their source lines."""
    out = []
    for d in _data(doc, "syncs")[:1]:
        out.append("\n**host syncs per training step** (`torch.cuda.set_sync_debug_mode('warn')`)\n\n")
        out.append(
            _table(
                ["method", "syncs / step", "expected", "logging step", "sites"],
                [
                    [
                        m,
                        r["syncs_per_step"],
                        r["expected"],
                        r["logging_step_syncs"],
                        ", ".join(f"{k} x{v}" for k, v in r["sites"].items()),
                    ]
                    for m, r in d.get("methods", {}).items()
                ],
            )
        )
    return "".join(out)


def render_compile(doc: dict) -> str:
    """The loss core's graphs and breaks; in a full check, compiled against eager."""
    out = []
    for d in _data(doc, "compile")[:1]:
        extra = (
            f"; compiled vs eager: loss rel err {_f(d['loss_rel_err'])}, gradient rel err "
            f"{_f(d['grad_rel_err'])}, first compiled call {_f(d['first_compiled_call_s'])} s"
            if "loss_rel_err" in d
            else ""
        )
        out.append(
            f"\n**compile** (RePlaid loss core on CUDA): {d['graph_count']} graph(s), "
            f"{d['graph_break_count']} graph breaks{extra}\n"
        )
    return "".join(out)


def render_speed(doc: dict) -> str:
    """The training step's speed, eager (``speed``) and compiled (``speed_compiled``), in one table."""
    speed = [(d, "eager") for d in _data(doc, "speed")] + [(d, "compiled") for d in _data(doc, "speed_compiled")]
    if not speed:
        return ""
    out = [
        f"\n**training step at {PRESET}** (MFU = the model's training FLOPs per token x tokens/s / the "
        f"bf16 matmul peak, measured or the datasheet's)\n\n"
    ]
    out.append(
        _table(
            [
                "method",
                "mode",
                "precision",
                "batch x L",
                "step s",
                "tokens/s",
                "MFU (measured peak)",
                "MFU (datasheet)",
                "peak mem GB",
                "model GB",
                "warm-up s",
            ],
            [
                [
                    d["method"],
                    mode,
                    d["precision"],
                    f"{d['batch']} x {d['L']}",
                    d["step_s"],
                    d["tokens_per_s"],
                    _pct(d.get("mfu")),
                    _pct(d.get("mfu_datasheet")),
                    d["peak_mem_gb"],
                    d["model_gb"],
                    d.get("warmup_s"),
                ]
                for d, mode in speed
            ],
        )
    )
    return "".join(out)


def render_memory(doc: dict) -> str:
    """Peak memory against ``replaid memory``'s model, at the memory step's batches and the speed step's."""
    if not _data(doc, "memory"):
        return ""
    mem = _data(doc, "memory") + _data(doc, "speed")
    out = ["\n**peak memory vs `replaid memory`** (max allocated; the model's estimate for the same batch)\n\n"]
    out.append(
        _table(
            ["method", "batch", "measured GB", "model GB", "measured / model"],
            [
                [d["method"], d["batch"], d["peak_mem_gb"], d["model_gb"], d["peak_mem_gb"] / d["model_gb"]]
                for d in sorted(mem, key=lambda d: (d["method"], d["batch"]))
            ],
        )
    )
    return "".join(out)


def render_maxbatch(doc: dict) -> str:
    """The largest batch that fits against the memory model's prediction."""
    mb = _data(doc, "maxbatch")
    if not mb:
        return ""
    out = [
        "\n**largest batch that fits** (one training step; out-of-memory search from the model's "
        "prediction for the whole device memory)\n\n"
    ]
    out.append(
        _table(
            ["method", "measured largest", "first failing", "model's prediction", "device GB", "probes"],
            [
                [
                    d["method"],
                    d["max_batch"],
                    d["first_failing_batch"],
                    d["predicted_max_batch"],
                    d["device_memory_gb"],
                    len(d["probes"]),
                ]
                for d in mb
            ],
        )
    )
    return "".join(out)


def render_sampler(doc: dict) -> str:
    """Each sampler's NFE/s and tokens/s (bench_sample.py prints one JSON line per sampler)."""
    sm = [x for d in _data(doc, "sampler") for x in (d if isinstance(d, list) else [d])]
    if not sm:
        return ""
    out = [f"\n**samplers** (untrained {PRESET} weights; bf16 autocast on a GPU)\n\n"]
    out.append(
        _table(
            ["sampler", "T", "NFE", "batch x L", "V", "s", "NFE/s", "tokens/s"],
            [
                [
                    d["sampler"],
                    d["T"],
                    d["nfe"],
                    f"{d['batch']} x {d['L']}",
                    d["V"],
                    d["seconds"],
                    d["nfe_per_s"],
                    d["tokens_per_s"],
                ]
                for d in sm
            ],
        )
    )
    return "".join(out)


def render_likelihood(doc: dict) -> str:
    """The ODE likelihood's time per sequence-sample."""
    out = []
    for d in _data(doc, "likelihood")[:1]:
        out.append(
            f"\n**ODE likelihood** ({d['n_seqs']} sequences x K = {d['K']}, L = {d['L']}, Heun {d['steps']} "
            f"steps, {d['n_hutch']} probe(s), batch {d['batch_size']}): {_f(d['s_per_sequence_sample'])} s per "
            f"sequence-sample ({_f(d['s_per_sequence_at_128_steps'])} s at 128 steps), {d['nfe']} NFE, "
            f"{_f(d['nfe_per_s'])} NFE/s\n"
        )
    return "".join(out)


def render_mdlm_ref(doc: dict) -> str:
    """The MDLM reference's step beside replaid's MDLM at the same batch (from the speed step), or why
    it was not run."""
    out = []
    ref = doc.get("steps", {}).get("mdlm_ref", {})
    for d in _data(doc, "mdlm_ref")[:1]:
        ours = next((x for x in _data(doc, "speed") if x["method"] == "mdlm" and x["batch"] == d["batch"]), None)
        rows = [["kuleshov-group/mdlm", d["batch"], d["step_s"], d["tokens_per_s"], d["peak_mem_gb"], d["loss"]]]
        if ours:
            rows.append(
                [
                    "replaid mdlm (eager)",
                    ours["batch"],
                    ours["step_s"],
                    ours["tokens_per_s"],
                    ours["peak_mem_gb"],
                    ours["loss"],
                ]
            )
        out.append(f"\n**MDLM reference vs replaid's MDLM** (L = {d['L']}; {'; '.join(d.get('stand_ins', []))})\n\n")
        out.append(_table(["code", "batch", "step s", "tokens/s", "peak mem GB", "loss"], rows))
    if ref.get("status") == "skipped":
        out.append(f"\n**MDLM reference**: not run: {ref.get('reason')}\n")
    return "".join(out)


def render_blocks(doc: dict, step: str = "blocks") -> str:
    """Block diffusion against AR and the full sequence (benchmarks/bench_blocks.py's rows)."""
    got = _data(doc, step)
    if not got:
        return ""
    rows = [r for r in got[0]["rows"] if "error" not in r]
    failed = [f"{r['family']} {r['method']} batch {r['batch']}: {r['error']}" for r in got[0]["rows"] if "error" in r]
    meta = got[0].get("meta", {})
    out = [
        f"\n**block diffusion** (issue 39 §4: blocks with a KV cache against AR with its cache and the full "
        f"sequence at the same steps per position; untrained `{meta.get('preset', 'demo')}` size; (b) of a "
        "full-sequence row: the block size it matches)\n\n"
    ]
    out.append(
        _table(
            ["family", "method", "b", "batch", "length", "first block s", "tokens/s", "peak MiB"],
            [
                [
                    r["family"],
                    r["method"],
                    # a full-sequence row: the block size whose steps per position it matches, in brackets
                    f"({r.get('matched_block')})" if r["family"] == "full" else r["block"] or "-",
                    r["batch"],
                    f"{r['length_x']}x",
                    r["ttfb_s"],
                    r["tokens_per_s"],
                    r["peak_mem_bytes"] / 2**20,
                ]
                for r in rows
            ],
        )
    )
    out += [f"- failed: {f}\n" for f in failed]
    return "".join(out)


def render_breakdown(doc: dict) -> str:
    """One training step per method taken apart (benchmarks/bench_breakdown.py's rows and bytes model)."""
    got = _data(doc, "breakdown")
    if not got:
        return ""
    meta, rows = got[0].get("meta", {}), got[0]["rows"]
    out = [
        f"\n**step breakdown** (issue 53 §1: `{meta.get('preset')}`, batch {meta.get('batch')} x {meta.get('L')}; "
        "indented rows: named regions inside the phases, inclusive)\n\n"
    ]
    out.append(
        _table(["method", "part", "ms / step", "share"], [[r["method"], r["part"], r["ms"], r["share"]] for r in rows])
    )
    for k, v in got[0].get("bytes_model", {}).items():
        s = f", {v['seconds'] * 1e3:.1f} ms at the bandwidth given" if v.get("seconds") else ""
        out.append(f"- bytes model {k}: {v['bytes_per_logit']} B per logit, {v['gb']:.1f} GB per step{s}\n")
    return "".join(out)


def render_serve(doc: dict) -> str:
    """Served completions under load (benchmarks/load_grid.py's rows)."""
    got = _data(doc, "serve")
    if not got:
        return ""
    meta, rows = got[0].get("meta", {}), got[0]["rows"]
    out = [
        f"\n**served completions under load** (issue 52 §3: `/v1/completions`, {meta.get('max_tokens')} tokens a "
        f"request at {meta.get('steps')} steps per block, the server's default limits; briefly trained runs)\n\n"
    ]
    ok = [r for r in rows if "error" not in r]
    out.append(
        _table(
            ["run", "b", "clients", "TTFT p50 s", "TTFT p95 s", "latency p95 s", "tokens/s", "429s", "peak MiB"],
            [
                [
                    r["run"],
                    r["block"],
                    r["clients"],
                    r["ttft_p50_s"],
                    r["ttft_p95_s"],
                    r["latency_p95_s"],
                    r["tokens_per_s"],
                    r["refused_429"],
                    r["rss_peak_mib"],
                ]  # fmt: skip
                for r in ok
            ],
        )
    )
    out += [f"- failed: {r['run']} x {r['clients']}: {r['error']}\n" for r in rows if "error" in r]
    return "".join(out)


def render_bf16_train(doc: dict) -> str:
    """RePlaid bf16 against fp32 over whole runs: each run's reach, gradient norms, first non-finite step and
    last bound; the bf16 runs against the fp32 seed interval and the paired difference."""
    out = []
    for d in _data(doc, "bf16_train")[:1]:
        at = d.get("step")
        out.append(
            f"\n**RePlaid bf16 against fp32 over whole runs** (docs/results/trend/bf16.yaml; bounds at step {at})\n\n"
        )
        rows = []
        for name, r in d.get("runs", {}).items():
            last = r["bounds"].get(str(at)) if at is not None else None
            rows.append(
                [
                    name,
                    r["last_step"],
                    r["max_grad_norm"],
                    r["max_grad_norm_endpoints"],
                    r["first_nonfinite_step"] if r["first_nonfinite_step"] is not None else "-",
                    _f(last, ".4f"),
                ]
            )
        heads = ["run", "last step", "max grad norm", "max endpoints' grad", "first non-finite step", "bound"]
        out.append(_table(heads, rows))
        if "paired" in d:
            p, ref = d["paired"], d["reference_interval"]
            out.append(
                f"\nfp32 seed interval [{_f(ref['lo'], '.4f')}, {_f(ref['hi'], '.4f')}]; bf16 inside it: "
                f"{d['inside_reference_interval']}; bf16 - fp32 paired {_f(p['diff_mean'], '.4f')} "
                f"[{_f(p['diff_lo'], '.4f')}, {_f(p['diff_hi'], '.4f')}] ({p['verdict']}); "
                f"diverged: {', '.join(d['diverged']) or 'none'}\n"
            )
    return "".join(out)


def render_plateau_b512(doc: dict) -> str:
    """The plateau's exit at batch 512: each run's reach, exit (steps and tokens) and final bound."""
    out = []
    for d in _data(doc, "plateau_b512")[:1]:
        out.append(
            "\n**The plateau's exit at batch 512** (docs/results/plateau/arms-b512.yaml; logs in plateau_b512/)\n\n"
        )
        rows = [
            [
                name,
                r["last_step"],
                "-" if r["exit_step"] is None else r["exit_step"],
                "-" if r["exit_tokens"] is None else f"{r['exit_tokens']:,}",
                _f(r["bound"], ".4f"),
            ]
            for name, r in d.get("runs", {}).items()
        ]
        out.append(_table(["run", "last step", "exit (steps)", "exit (tokens)", "final test bound"], rows))
    return "".join(out)


# each step's part of the table, in the order of the page (speed_compiled is in the speed table; the
# memory table follows speed, the largest batch follows memory)
RENDERERS: list[tuple[str, Callable[[dict], str]]] = [
    ("env", render_env),
    ("tests", render_tests),
    ("bf16", render_bf16),
    ("syncs", render_syncs),
    ("compile", render_compile),
    ("speed", render_speed),
    ("memory", render_memory),
    ("maxbatch", render_maxbatch),
    ("sampler", render_sampler),
    ("likelihood", render_likelihood),
    ("mdlm_ref", render_mdlm_ref),
    ("blocks", render_blocks),
    ("breakdown", render_breakdown),
    ("blocks_01b", lambda doc: render_blocks(doc, "blocks_01b")),
    ("serve", render_serve),
    ("bf16_train", render_bf16_train),
    ("plateau_b512", render_plateau_b512),
]
