"""Every replaid run as an lm-evaluation-harness model: ``lm_eval --model replaid --model_args run=PATH``.

Needs the ``lmeval`` extra (``pip install 'replaid[lmeval]'``, pinned ``lm-eval``). ``run`` is a run
directory, an exported folder or a Hub id (:func:`replaid.store.loading.load_run`, as every command).
What each request's number is (:mod:`replaid.eval.harness`, where the windows are stated):

* ``loglikelihood(context, continuation)``: ``log p(continuation | context)``: exact for AR (with
  ``is_greedy``: teacher-forced argmax decoding); for MDLM/Duo the NELBO with only the continuation
  corrupted (a lower bound on the log-likelihood); for RePlaid/Plaid/LangFlow the continuation's share
  of the VDM NELBO with the context noised as the inpainting samplers see it, a lower bound on the
  log-likelihood of that inpainting conditional. ``mc_samples`` diffusion times per row (stratified,
  low-discrepancy), one generator seeded by ``seed``.
* ``loglikelihood_rolling(document)``: the document's tokens in windows of the model's length L, each
  token scored once; windows without context take the joint bound (``replaid zeroshot``'s computation;
  ``likelihood=ode`` with ``K``: the ODE/IWAE bound), the context-overlapped last window the conditional.
* ``generate_until(context, gen_kwargs)``: a prompted sample with the run's default sampler
  (``gen_steps`` steps), at most ``max_gen_toks`` tokens and at most the model's length, cut at EOS and
  at the ``until`` strings. Greedy (temperature 0: the argmax of every draw) unless the request sets
  ``do_sample`` or a ``temperature`` > 0, as the harness defines them; a sampled request without a
  temperature uses the model argument ``temperature``.

Model arguments (``--model_args key=value,...``): run, mc_samples (4), seed (0), rolling_context (0:
the harness's ``context_len=1``), likelihood (nelbo | ode), K (1), ode_steps (64), gen_steps (64),
temperature (1.0), ema (True), device (auto), progress (True); the harness's batch_size (8).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from replaid.eval.harness import Row, Scorer, request_rows, rolling_rows, totals

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance


def _bool(v: object) -> bool:
    return v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes", "on")


@register_model("replaid")
class ReplaidLM(LM):  # type: ignore[misc]  # lm_eval ships no type information: LM is Any to mypy
    """A replaid run (any method) behind the harness's three request types (module docstring)."""

    def __init__(
        self,
        run: str | None = None,
        mc_samples: int = 4,
        seed: int = 0,
        rolling_context: int = 0,
        likelihood: str = "nelbo",
        K: int = 1,
        ode_steps: int = 64,
        gen_steps: int = 64,
        temperature: float = 1.0,
        ema: bool = True,
        device: str | None = "auto",
        progress: bool = True,
        batch_size: int | str = 8,
        **unused: Any,
    ) -> None:
        super().__init__()
        from replaid.store.loading import load_run

        if run is None:
            raise ValueError("--model_args needs run=PATH (a run directory, an exported folder or a Hub id)")
        unknown = sorted(k for k in unused if k not in ("max_batch_size", "pretrained", "trust_remote_code"))
        if unknown:
            raise ValueError(
                f"unknown model argument(s) {', '.join(unknown)} for --model replaid; see replaid.hub.lmeval"
            )
        if device and str(device).startswith("cuda") and not torch.cuda.is_available():
            # the harness's CLI passes its default device (cuda) to every model; as its own HF model
            # does, fall back to what this machine has rather than refuse
            print(f"replaid: device {device} is not available here; using the CPU", file=sys.stderr)
            device = "cpu"
        self.run = load_run(run, use_ema=_bool(ema), device=device or "auto")
        bs = 8 if str(batch_size).startswith("auto") else int(batch_size)
        self.scorer = Scorer(
            self.run,
            mc=int(mc_samples),
            batch_size=bs,
            seed=int(seed),
            likelihood=str(likelihood),
            K=int(K),
            ode_steps=int(ode_steps),
            progress=_bool(progress),
        )
        self.rolling_context = int(rolling_context)
        if not 0 <= self.rolling_context < self.scorer.L:
            raise ValueError(f"rolling_context={rolling_context} must be in [0, {self.scorer.L - 1}]")
        self.gen_steps, self.temperature, self.seed = int(gen_steps), float(temperature), int(seed)
        self.tok = self.run.tokenizer
        self.timing = {"loglikelihood": [0, 0.0], "loglikelihood_rolling": [0, 0.0], "generate_until": [0, 0.0]}

    # ------------------------------------------------------------------ what the numbers are
    def describe(self) -> dict[str, Any]:
        """The method, what its loglikelihood is, the Monte Carlo count and the time per request."""
        m = self.run.method
        per = {k: (round(s / n, 4) if n else None) for k, (n, s) in self.timing.items()}
        return {
            "method": m.name,
            "loglikelihood": self.scorer.what(),
            "rolling": "exact" if m.conditional == "exact" else f"bound ({self.scorer.likelihood})",
            "mc_samples": None if m.conditional == "exact" else self.scorer.mc,
            "K": self.scorer.K if self.scorer.likelihood == "ode" else None,
            "seq_len": self.scorer.L,
            "rolling_context": self.rolling_context,
            "seed": self.seed,
            "checkpoint": str(self.run.ckpt),
            "step": self.run.step,
            "weights": "ema" if self.run.ema_loaded else "raw",
            "requests": {k: n for k, (n, _) in self.timing.items()},
            "seconds_per_request": per,
        }

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """The harness's split: trailing spaces of the context go to the continuation; the continuation's
        tokens are those of ``context + continuation`` past the context's."""
        n_space = len(context) - len(context.rstrip())
        if n_space:
            continuation, context = context[-n_space:] + continuation, context[:-n_space]
        whole = self.tok.encode(context + continuation)
        ctx = self.tok.encode(context) if context else []
        return whole[: len(ctx)], whole[len(ctx) :]

    # ------------------------------------------------------------------ the three request types
    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        t0 = time.time()
        rows: list[Row] = []
        for i, req in enumerate(requests):
            ctx, cont = self._encode_pair(*req.args)
            rows += request_rows(ctx, cont, self.scorer.L, i, self.rolling_context)
        self.scorer.score(rows, greedy=True, desc="loglikelihood")
        out = totals(rows, len(requests))
        for req, r in zip(requests, out, strict=True):
            self.cache_hook.add_partial("loglikelihood", req.args, r)
        self._time("loglikelihood", len(requests), t0)
        return out

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        t0 = time.time()
        rows: list[Row] = []
        for i, req in enumerate(requests):
            rows += rolling_rows(self.tok.encode(req.args[0]), self.scorer.L, i, self.rolling_context)
        self.scorer.score(rows, desc="loglikelihood_rolling")
        out = [ll for ll, _ in totals(rows, len(requests))]
        for req, r in zip(requests, out, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, r)
        self._time("loglikelihood_rolling", len(requests), t0)
        return out

    def generation_settings(self, gen_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        """The harness's ``gen_kwargs`` as it defines them (its own ``normalize_gen_kwargs``): greedy
        unless ``do_sample`` is true or a ``temperature`` > 0 is given; a sampled request without a
        temperature takes the model argument ``temperature``. Returns ``until`` (stop strings),
        ``max_gen_toks``, ``temperature`` (0 = greedy: the argmax of every draw, see
        :class:`~replaid.sampling.SampleRequest`) and ``top_p`` (AR runs)."""
        from lm_eval.models.utils import normalize_gen_kwargs

        kw = dict(normalize_gen_kwargs(dict(gen_kwargs or {}), default_max_gen_toks=256))
        until = [u for u in kw.pop("until") if u]
        max_gen_toks = int(kw.pop("max_gen_toks"))
        do_sample = bool(kw.pop("do_sample"))
        temperature = float(kw.pop("temperature", 0.0) or 0.0)
        top_p = kw.pop("top_p", None)
        if kw:
            raise ValueError(
                f"generation argument(s) {', '.join(sorted(kw))} not supported by --model replaid "
                f"(it honours until, max_gen_toks, do_sample, temperature, top_p)"
            )
        if max_gen_toks < 1:
            raise ValueError(f"max_gen_toks={max_gen_toks}: need at least 1 token to generate")
        if top_p is not None and self.run.method.name != "ar":
            raise ValueError(f"top_p is an AR setting; this run's method is {self.run.method.name}")
        if not do_sample:
            temperature = 0.0
        elif temperature <= 0:
            temperature = self.temperature
        return {"until": until, "max_gen_toks": max_gen_toks, "temperature": temperature, "top_p": top_p}

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        """Each request's continuation: at most ``max_gen_toks`` tokens after the context (the context
        cut from the left so both fit in the model's length L), cut at the first EOS token and then,
        as the harness cuts, at each ``until`` string."""
        from lm_eval.models.utils import postprocess_generated_text

        from replaid.sampling.generate import generate
        from replaid.sampling.request import SampleRequest

        t0 = time.time()
        L = self.scorer.L
        eos = getattr(self.tok, "eos_id", None)
        out = []
        for req in tqdm(requests, desc="generate_until", disable=disable_tqdm or not self.scorer.progress):
            context, gen_kwargs = req.args
            g = self.generation_settings(gen_kwargs)
            ctx = self.tok.encode(context) if context else []
            n = min(g["max_gen_toks"], L - 1 if ctx else L)  # tokens to generate
            ctx = ctx[max(0, len(ctx) + n - L) :]  # the context's last L - n tokens
            sreq = SampleRequest(
                num=1,
                batch_size=1,
                steps=self.gen_steps,
                length=len(ctx) + n if ctx else max(n, 2),
                prompt=self.tok.decode(ctx) if ctx else None,
                temperature=g["temperature"],
                top_p=g["top_p"],
                seed=self.seed,
                progress=False,
            )
            row = generate(self.run, sreq)[0]
            n_pre = len(self.tok.encode(sreq.prompt)) if sreq.prompt else 0
            ids = list(row["ids"][n_pre : n_pre + n])
            if eos is not None and eos in ids:
                ids = ids[: ids.index(eos)]
            text = postprocess_generated_text(self.tok.decode(ids), g["until"], None)
            self.cache_hook.add_partial("generate_until", req.args, text)
            out.append(text)
        self._time("generate_until", len(requests), t0)
        return out

    def _time(self, kind: str, n: int, t0: float) -> None:
        self.timing[kind][0] += n
        self.timing[kind][1] += time.time() - t0
