"""Autoregressive baseline: the same DiT blocks with causal attention and no time conditioning.

Convention (exact NLL of all L tokens): the input is ``[BOS, x_0, ..., x_{L-2}]`` where BOS is a
dedicated *input-only* id ``V`` (the network outputs V logits, never BOS), and position l predicts
``x_l``. So ``nll`` is ``-(1/L) sum_l log p(x_l | BOS, x_<l)``, comparable per token with the
diffusion bounds on the same L tokens (no position is left unscored). With packed data the BOS
simply marks the start of the window, not of a document.

Sampling is ancestral (temperature, optional nucleus/top-p) with a KV cache
(:meth:`~replaid.model.tokens.TokenDiT.forward_cached`), one network call per token.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from replaid.config import RunConfig
from replaid.diffusion.rng import device_generator
from replaid.model.tokens import TokenDiT
from replaid.diffusion.nelbo import masked_mean



def shift_right(tokens: Tensor, bos: int) -> Tensor:
    """(B, L) -> (B, L): ``[BOS, x_0, ..., x_{L-2}]``."""
    return torch.cat([torch.full_like(tokens[:, :1], bos), tokens[:, :-1]], dim=1)


def top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p``; renormalise. (B, V)."""
    if top_p >= 1.0:
        return probs
    sp, idx = probs.sort(dim=-1, descending=True)
    keep = (sp.cumsum(-1) - sp) < top_p  # the top token is always kept
    sp = sp * keep
    out = torch.zeros_like(probs).scatter(-1, idx, sp)
    return out / out.sum(-1, keepdim=True)


def exponential_race(probs: Tensor, generator: Optional[torch.Generator]) -> Tensor:
    """Categorical draw over the last dim by Gumbel-max as an exponential race:
    ``argmax_v p_v / E_v`` with ``E_v ~ Exp(1)`` drawn in float64 on ``probs``' device (from a
    generator there, derived from ``generator`` when it lives elsewhere)."""
    gen = device_generator(generator, probs.device)
    e = torch.empty(probs.shape, dtype=torch.float64, device=probs.device).exponential_(generator=gen)
    return (probs.double() / e).argmax(-1)


class ARMethod:
    name = "ar"

    def __init__(self, cfg: RunConfig, top_p: float | None = None):
        self.cfg = cfg
        self.top_p = cfg.baseline.ar_top_p if top_p is None else top_p  # nucleus mass (1.0 = off)
        self.vocab_size: Optional[int] = None

    def build_model(self, vocab_size: int) -> TokenDiT:
        self.vocab_size = vocab_size
        return TokenDiT(self.cfg.model, vocab_size + 1, vocab_size, time_conditioning=False, causal=True)

    def _nll_rows(self, model: TokenDiT, tokens: Tensor, mask: Optional[Tensor]) -> Tensor:
        B, L = tokens.shape
        logits = model(shift_right(tokens, model.n_in - 1))  # (B, L, V) float32
        ce = F.cross_entropy(logits.float().reshape(B * L, -1), tokens.reshape(B * L), reduction="none")
        return masked_mean(ce.view(B, L), mask)  # (B,) float64

    def train_loss(self, model: TokenDiT, tokens: Tensor, generator: torch.Generator,
                   mask: Optional[Tensor] = None) -> tuple[Tensor, dict]:
        nll = self._nll_rows(model, tokens, mask)
        return nll.mean(), {"loss": nll.detach(), "nll": nll.detach()}

    @torch.no_grad()
    def eval_bound(self, model: TokenDiT, tokens: Tensor, generator: torch.Generator,
                   mask: Optional[Tensor] = None) -> dict[str, Tensor]:
        return {"nll": self._nll_rows(model, tokens, mask)}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, d: dict) -> None:
        pass

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def sample(self, model: TokenDiT, B: int, L: int, generator: torch.Generator, temperature: float = 1.0,
               top_p: Optional[float] = None, prefix: Optional[Tensor] = None,
               callback: Optional[Callable[[dict], None]] = None) -> tuple[Tensor, int]:
        """Ancestral sampling with a KV cache. Returns (tokens (B, L), number of network calls).

        ``callback`` is called after each new token with ``{"i", "T": number of generated positions,
        "pos", "tokens": (B, L) (valid up to pos), "probs": (B, V) float64 distribution drawn from}``."""
        top_p = self.top_p if top_p is None else top_p
        dev = next(model.parameters()).device
        bos = model.n_in - 1
        out = torch.empty(B, L, dtype=torch.long, device=dev)
        n_pre = 0 if prefix is None else min(int(prefix.shape[-1]), L)
        if n_pre:
            out[:, :n_pre] = prefix[..., :n_pre].to(dev)
        cache: list = []
        inp = torch.cat([torch.full((B, 1), bos, dtype=torch.long, device=dev), out[:, :n_pre]], dim=1)
        logits = model.forward_cached(inp, cache, 0)[:, -1]
        nfe = 1
        for pos in range(n_pre, L):
            lg = logits.double() / max(temperature, 1e-8)
            probs = top_p_filter(torch.softmax(lg, -1), top_p)
            # Gumbel-max through an exponential race, in float64
            out[:, pos] = exponential_race(probs, generator)
            if callback is not None:
                callback({"i": pos - n_pre, "T": L - n_pre, "pos": pos, "tokens": out, "probs": probs})
            if pos + 1 < L:
                logits = model.forward_cached(out[:, pos:pos + 1], cache, pos + 1)[:, -1]
                nfe += 1
        return out, nfe

    def sample_rows(self, run, args) -> list[dict]:
        from replaid.eval.generate import ancestral_rows

        def draw(B, L, gen, prefix):
            return self.sample(run.model, B, L, gen, args.temperature, getattr(args, "top_p", None), prefix)

        return ancestral_rows(run, args, draw, args.length or run.cfg.data.seq_len)
