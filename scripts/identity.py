"""Fingerprints of what a refactor must leave bit for bit unchanged (issue 23).

    python scripts/identity.py --src src --out /tmp/after.json            # this checkout
    python scripts/identity.py --src /tmp/base/src --out /tmp/before.json  # another version's src/
    python scripts/identity.py --compare /tmp/before.json /tmp/after.json

Every figure is taken through the command line (``python -m replaid``, the one interface both versions
share) in fresh processes at one thread, with ``PYTHONPATH`` set to ``--src``:

* per method (replaid, plaid, ar, mdlm, duo): a ``debug`` run of 20 steps: its final evaluation (every
  number, full precision), a SHA-256 of the trained and EMA weights, and the logged training losses;
* every sampler the run offers at a fixed seed (and prompt / infill / temperature / no-s.c. variants):
  a SHA-256 of the sampled ids, and of the playground's (web engine's) final ids for the same request;
* each converted peer fixture (``tests/fixtures/peers``): the converted folder's logits on the
  fixture inputs (SHA-256 of the float32 bytes and the max |difference| to the peer's), its evaluation
  and its samples.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FX = REPO / "tests" / "fixtures" / "peers"
CONTINUOUS = ("ddpm", "ddim", "dpmpp2m", "heun")


def sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


class Env:
    def __init__(self, src: Path, work: Path):
        self.src, self.work = src.resolve(), work
        self.env = {
            **os.environ,
            "PYTHONPATH": str(self.src),
            "OMP_NUM_THREADS": "1",
            "REPLAID_CACHE_DIR": str(work / "cache"),
            "HF_HUB_OFFLINE": "1",
        }

    def replaid(self, *args: str) -> str:
        r = subprocess.run([sys.executable, "-m", "replaid", *args], env=self.env, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"replaid {' '.join(args)} failed:\n{r.stderr[-3000:]}")
        return r.stdout

    def python(self, code: str, *args: str) -> str:
        r = subprocess.run([sys.executable, "-c", code, *args], env=self.env, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"python snippet failed:\n{r.stderr[-3000:]}")
        return r.stdout


WEIGHTS = """
import hashlib, json, sys
from pathlib import Path
from safetensors.torch import load_file
ck = Path(sys.argv[1])
out = {}
for name in ("model", "ema"):
    f = ck / f"{name}.safetensors"
    if f.is_file():
        sd = load_file(str(f))
        h = hashlib.sha256()
        for k in sorted(sd):
            h.update(k.encode()); h.update(sd[k].contiguous().numpy().tobytes())
        out[name] = h.hexdigest()[:16]
print(json.dumps(out))
"""

WEB = """
import hashlib, json, sys, torch
torch.set_num_threads(1)
from replaid.hub import from_pretrained as load_run
from replaid.web.engine import generate_stream, parse, samplers_for
run = load_run(sys.argv[1], device="cpu")
out = {}
for sampler in samplers_for(run):
    for text in ("", "Return the"):
        req = parse({"run": sys.argv[1], "sampler": sampler, "steps": 6, "seed": 3, "samples": 2, "text": text})
        frames = []
        res = generate_stream(run, req, frames.append)
        out[f"{sampler}|{text}"] = hashlib.sha256(json.dumps([res.ids, [f.get("ids") for f in frames]]).encode()).hexdigest()[:16]
print(json.dumps(out))
"""

PEER_LOGITS = """
import hashlib, json, sys, torch
from safetensors.torch import load_file
torch.set_num_threads(1)
from replaid.hub import from_pretrained
kind, folder, fx = sys.argv[1:4]
run = from_pretrained(folder, device="cpu")
m = run.model
e = load_file(fx + "/expected.safetensors")
with torch.no_grad():
    if kind == "mdlm":
        outs = [m(e["input_ids"])]; refs = [e["logits"][..., :-1]]
    elif kind == "duo":
        outs = [m(e["input_ids"], (1 - e["alpha_t"]).float())]; refs = [e["logits"]]
    else:
        outs = [m(e["z"], e["gamma"], None).logits, m(e["z"], e["gamma"], e["x_self_cond"]).logits]
        refs = [e["logits_no_sc"], e["logits_sc"]]
h = hashlib.sha256()
for o in outs:
    h.update(o.contiguous().numpy().tobytes())
print(json.dumps({"sha": h.hexdigest()[:16], "max_abs_diff": max(float((o - r).abs().max()) for o, r in zip(outs, refs))}))
"""


def sample_variants(continuous: bool) -> dict[str, list[str]]:
    base = ["--steps", "8", "--num", "3", "--batch-size", "2", "--seed", "0", "--json"]
    if continuous:
        v = {s: ["--sampler", s, *base] for s in CONTINUOUS}
        v["ddpm-prompt"] = ["--prompt", "Return the", *base]
        v["ddim-infill"] = ["--sampler", "ddim", "--context", "Return the [MASK:3] of the list.", *base]
        v["ddpm-temps"] = ["--temperature", "0.7", "--score-temperature", "0.8", *base]
        v["heun-nosc-traj"] = ["--sampler", "heun", "--no-self-cond", "--trajectory", "3", *base]
    else:
        v = {
            "ancestral": base,
            "prompt": ["--prompt", "Return the", *base],
            "temperature": ["--temperature", "0.7", *base],
        }
    return v


def samples(env: Env, run: Path, continuous: bool) -> dict:
    out = {}
    for name, args in sample_variants(continuous).items():
        rows = [json.loads(x) for x in env.replaid("sample", str(run), *args).splitlines() if x.strip()]
        out[name] = sha([[r["ids"], r.get("trajectory"), r["nfe"]] for r in rows])
    return out


def fingerprints(src: Path, methods: list[str], peers: list[str], web: bool) -> dict:
    res: dict = {}
    with tempfile.TemporaryDirectory(prefix="replaid-identity-") as tmp:
        env = Env(src, Path(tmp))
        for m in methods:
            run = Path(tmp) / m
            env.replaid(
                "train", "--preset", "debug", "--method", m, "--out", str(run), "--no-progress", "train.num_threads=1"
            )
            ev = json.loads((run / "final_eval.json").read_text())["eval"]
            losses = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            ck = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()
            res[f"{m}/eval"] = {k: v for k, v in ev.items() if k != "seconds"}
            res[f"{m}/train_losses"] = sha(
                [{k: v for k, v in r.items() if k in ("step", "loss", "grad_norm", "B_r")} for r in losses]
            )
            res[f"{m}/weights"] = json.loads(env.python(WEIGHTS, str(ck)))
            res[f"{m}/samples"] = samples(env, run, m in ("replaid", "plaid"))
            if web:
                res[f"{m}/web"] = json.loads(env.python(WEB, str(run)))
            print(f"{m}: {res[f'{m}/eval']}", file=sys.stderr, flush=True)
        tj = FX / "words.json"  # a 40-word tokenizer (the fixtures' vocabulary size)
        over = [
            "data.tokenizer=file",
            f"data.tokenizer_path={tj}",
            "data.source=stdlib",
            "data.max_docs=200",
            "eval.batch_size=4",
            "eval.t_samples=2",
        ]
        for kind in peers:
            out = Path(tmp) / f"peer-{kind}"
            env.replaid("convert", kind, str(FX / kind), "--out", str(out), "--set", *over)
            res[f"peer-{kind}/logits"] = json.loads(env.python(PEER_LOGITS, kind, str(out), str(FX / kind)))
            ev = json.loads(env.replaid("eval", str(out), "--max-batches", "1", "--json"))
            res[f"peer-{kind}/eval"] = {k: v for k, v in ev.items() if k not in ("seconds", "checkpoint", "run")}
            res[f"peer-{kind}/samples"] = samples(env, out, kind == "langflow")
            print(f"peer {kind}: {res[f'peer-{kind}/logits']}", file=sys.stderr, flush=True)
    return res


def compare(a: dict, b: dict) -> int:
    bad = 0
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            bad += 1
            print(f"DIFFERS {k}:\n  {a.get(k)}\n  {b.get(k)}")
    print(f"{len(set(a) | set(b)) - bad} of {len(set(a) | set(b))} fingerprints identical")
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default=str(REPO / "src"), help="the src/ folder of the version to fingerprint")
    p.add_argument("--out", help="write the fingerprints here (JSON)")
    p.add_argument("--methods", nargs="*", default=["replaid", "plaid", "ar", "mdlm", "duo"])
    p.add_argument("--peers", nargs="*", default=["mdlm", "duo", "langflow"])
    p.add_argument("--no-web", action="store_true", help="skip the playground engine's fingerprints")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two fingerprint files")
    a = p.parse_args()
    if a.compare:
        return compare(*(json.loads(Path(f).read_text()) for f in a.compare))
    res = fingerprints(Path(a.src), a.methods, a.peers, not a.no_web)
    text = json.dumps(res, indent=1, sort_keys=True)
    if a.out:
        Path(a.out).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
