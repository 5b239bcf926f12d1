"""The method contract: every member the trainer, evaluator, samplers, exporter and web app use.

A method turns a :class:`~replaid.config.RunConfig` into a network (:meth:`Method.build_model`), a
training loss (:meth:`Method.train_loss`) and a per-sequence bound (:meth:`Method.eval_bound`). What
a method *can do* is declared on its class, never probed:

* ``kind``: :class:`Kind` -- continuous (VP diffusion on token embeddings; its network is a
  :class:`~replaid.diffusion.denoiser.ContinuousModel`), masked, uniform (discrete diffusion on token
  ids; a :class:`~replaid.model.tokens.TokenDiT`) or autoregressive;
* ``trainable``: False for evaluation-only methods (converted peer checkpoints); the trainer and the
  config validation refuse to train them;
* ``samplers``: the names it offers in :mod:`replaid.sampling`'s registry, the default first;
* ``bound``: the key of :meth:`Method.eval_bound`'s main figure, ``"nelbo"`` (an upper bound) or ``"nll"``;
* ``conditional``: what :meth:`Method.conditional_nll` gives, ``"exact"`` or ``"bound"``;
* ``global_times``: the trainer draws low-discrepancy times for the *global* batch and hands each
  micro-batch its slice (``t_diff``), after :meth:`Method.recon_rows` rows kept for reconstruction.

A method owns its settings: ``options`` is its dataclass (declared beside it, with a ``validate()``
calling :func:`replaid.config.check`), stored in config files as the section ``section`` (by default
the method's name) and read as ``cfg.options``; ``model_keys`` lists the keys of
:class:`~replaid.config.ModelConfig` its network reads beyond the shared backbone
(:data:`replaid.config.BACKBONE_KEYS`). A key the chosen method reads in neither is refused in one line.
:meth:`check_config` refuses a config the method cannot run (with ``world_size`` ranks: the trainer's call).
:meth:`block_size` says whether a run writes text block by block (block diffusion, any length).
Methods are found by name through :mod:`replaid.registry` (this repository's, and plug-ins of the
entry-point group ``replaid.methods``); docs/adding-a-method.md shows the file an author writes.

The optional hooks have defaults: :meth:`before_step` / :meth:`after_step` (around each optimiser
step), :meth:`refresh` (on logging steps: the one host read of method statistics), :meth:`compile`,
:meth:`state_dict` / :meth:`load_state_dict` (method state saved in checkpoints and exports),
:meth:`eval_summary` (extra evaluation figures), :meth:`divergence_hint` (what to say when training
diverges), :meth:`greedy_logits` (lm-eval's greedy check), :meth:`probe` (the predictions at a fixed time behind the training log's plateau signatures)
and :meth:`embedding_rows` (the token embeddings ``replaid geometry`` draws).
The test module ``tests/test_method_contract.py`` runs every registered method through all of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeAlias, TypeVar

import torch
from torch import Tensor, nn

from replaid.config import ConfigError, RunConfig


@dataclass(frozen=True, eq=False)
class Kind:
    """What a method's network and samplers work on: a name, what it can do (asked by name wherever it
    matters: the FLOP and memory models, the refusals of the likelihood, diagnose, edit and infill paths,
    the batcher's keys) and where its sampling strategy is declared: ``strategy`` is the ``module:NAME``
    of a :class:`replaid.sampling.strategy.KindStrategy` (starter, samplers, block generator and kernel,
    playground frames), imported on first use as :mod:`replaid.registry` imports a method. A new kind is
    one file (the kind, its strategy, its method) plus its method's registry entry. Kinds compare by
    identity."""

    value: str
    strategy: str
    continuous: bool = False  # a continuous latent of token embeddings under a noise schedule: the PF-ODE
    # likelihood, SDEdit, infilling by replacement, classifier guidance, self-conditioning (T + 1 NFE)
    left_to_right: bool = False  # one token per step, left to right (its steps are its length; the GenPPL judge)
    mask_token: bool = False  # its noise is an extra [MASK] id (the network's ``n_out``), a block's start

    CONTINUOUS: ClassVar[Kind]  # VP diffusion on token embeddings (denoiser, noise schedule)
    MASKED: ClassVar[Kind]  # absorbing-state discrete diffusion ([MASK] id)
    UNIFORM: ClassVar[Kind]  # uniform-state discrete diffusion
    AUTOREGRESSIVE: ClassVar[Kind]  # left to right, exact likelihood

    def __str__(self) -> str:
        return self.value


Kind.CONTINUOUS = Kind("continuous", "replaid.sampling.kinds.continuous:STRATEGY", continuous=True)
Kind.MASKED = Kind("masked", "replaid.sampling.kinds.masked:STRATEGY", mask_token=True)
Kind.UNIFORM = Kind("uniform", "replaid.sampling.kinds.uniform:STRATEGY")
Kind.AUTOREGRESSIVE = Kind("autoregressive", "replaid.sampling.kinds.autoregressive:STRATEGY", left_to_right=True)
KINDS: tuple[Kind, ...] = (Kind.CONTINUOUS, Kind.MASKED, Kind.UNIFORM, Kind.AUTOREGRESSIVE)  # this repository's


ModelT = TypeVar("ModelT", bound=nn.Module)

# A micro-batch's metrics (:meth:`Method.train_loss`): per-row device tensors (B,) (losses, bounds), or
# one number for the micro-batch (RePlaid's B_r, Duo's tau); the trainer concatenates the tensors of
# the micro-batches and keeps the last number.
Metrics: TypeAlias = dict[str, Tensor | float]


@dataclass(frozen=True)
class Probe:
    """A method's token predictions at one fixed time, for the training log's plateau signatures
    (:mod:`replaid.training.signatures`): what the network predicts, where, and from what."""

    logits: Tensor  # (B, L, V) float32: the predicted token distribution's logits (output prior included)
    keep: Tensor  # (B, L) bool: positions with a prediction (MDLM: the masked ones)
    prior: Tensor | None = None  # (B, L, V): the output prior logits inside ``logits`` (RePlaid, Plaid)
    sc_estimate: Tensor | None = None  # (B, L, d_e): what self-conditioning fed back (the first pass's e_hat)
    clean: Tensor | None = None  # (B, L, d_e): the clean embeddings of the tokens
    sc_input: float | None = None  # ||W_sc(sqrt(d_e) e_sc)|| / ||h_0 without it||


class Method(ABC, Generic[ModelT]):
    """Base class of every method (module docstring), generic in the network it builds."""

    name: ClassVar[str]
    kind: ClassVar[Kind]
    description: ClassVar[str]  # one line for model cards
    samplers: ClassVar[tuple[str, ...]]  # names in replaid.sampling's registry for ``kind``; default first
    trainable: ClassVar[bool] = True
    bound: ClassVar[str] = "nelbo"  # "nelbo" | "nll"
    conditional: ClassVar[str] = "bound"  # what conditional_nll is: "exact" | "bound" (an upper bound on the NLL)
    global_times: ClassVar[bool] = False
    options: ClassVar[type | None] = None  # this method's options dataclass (None: it has none)
    section: ClassVar[str] = ""  # its section in config files; "" = the method's name
    model_keys: ClassVar[tuple[str, ...]] = ()  # ModelConfig keys its network reads beyond BACKBONE_KEYS

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg

    # ------------------------------------------------------------------ required
    @abstractmethod
    def build_model(self, vocab_size: int) -> ModelT:
        """A fresh network for a vocabulary of ``vocab_size`` tokens (on the current default device)."""

    @abstractmethod
    def eval_bound(
        self, model: ModelT, tokens: Tensor, generator: torch.Generator | None, mask: Tensor | None = None
    ) -> dict[str, Tensor]:
        """Per-sequence per-token nats (B,) float64 under ``bound`` (and its pieces) for tokens (B, L)."""

    @abstractmethod
    def conditional_nll(
        self, model: ModelT, tokens: Tensor, target: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        """Nats (B,) float64 of ``-log p(tokens[target] | tokens[~target])``, *summed* over the target
        positions of tokens (B, L) (target: (B, L) bool), under ``conditional``: exact, or an upper
        bound with ``eval.t_samples`` diffusion times per row (``replaid lmeval``'s loglikelihood)."""

    def train_loss(
        self,
        model: ModelT,
        tokens: Tensor,
        generator: torch.Generator,
        mask: Tensor | None = None,
        t_diff: Tensor | None = None,
        n_recon: int | None = None,
    ) -> tuple[Tensor, Metrics]:
        """(scalar loss, per-row metrics) of one micro-batch tokens (B, L). ``t_diff``: this micro-batch's
        slice of the global low-discrepancy times (``global_times``); ``n_recon``: :meth:`recon_rows`.
        Only trainable methods define it; the trainer never calls it on the others."""
        raise ConfigError(f"method={self.name} is evaluation-only: it cannot be trained")

    # ------------------------------------------------------------------ optional hooks
    def recon_rows(self, batch: int) -> int:
        """Rows of a micro-batch of ``batch`` rows that take no global time (RePlaid's adaptive split)."""
        return 0

    @classmethod
    def check_config(cls, cfg: RunConfig, world_size: int = 1) -> None:
        """Refuse (ConfigError, one line) a config this method cannot run: called by the config's
        validation (one rank) and by the trainer (``world_size`` ranks)."""

    def check_training(self, cfg: RunConfig, world_size: int = 1) -> None:
        """Refuse (ConfigError, one line) a training shape this method cannot learn from."""
        self.check_config(cfg, world_size)

    def sampling_refusal(self) -> str | None:
        """Why this run cannot be sampled yet (one line), or None."""
        return None

    @classmethod
    def training_block_size(cls, cfg: RunConfig) -> int:
        """Tokens per block when ``cfg`` trains block diffusion by BD3-LM's vectorised pass over
        ``[x_t, x_0]`` (2L rows; :func:`replaid.training.flops.train_flops_per_token` counts it), else 0."""
        return 0

    def block_size(self) -> int:
        """Tokens per block of a block-diffusion run, which writes text of any length block by block
        (:mod:`replaid.sampling.stream` finds its block generator by ``kind``); 0: one pass of its length."""
        return 0

    def stream_block(self) -> int:
        """Tokens a completion of any length commits at a time (:mod:`replaid.sampling.stream`): a
        block-diffusion run's block; AR overrides it with 1 (token by token over its KV cache); 0: the run
        writes one pass of its length."""
        return self.block_size()

    def before_step(self) -> None:
        """Called before each optimiser step."""

    def after_step(self, metrics: Metrics) -> None:
        """Called after each applied (finite) optimiser step with this rank's per-row metrics."""

    def refresh(self) -> None:
        """Called on logging steps: bring device-side statistics to the host."""

    def compile(self, model: ModelT) -> None:
        """``train.compile``: compile what the training step runs (by default the transformer blocks)."""
        model.get_submodule("backbone").compile()

    def state_dict(self) -> dict[str, Any]:
        """Method state saved with every checkpoint (JSON-able)."""
        return {}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    def eval_summary(self, model: ModelT) -> dict[str, float]:
        """Figures an evaluation reports beside the bound (e.g. the noise schedule's endpoints)."""
        return {}

    def divergence_hint(self, model: ModelT) -> str:
        """A likely cause to name, beside the learning rate, when training diverges ("" for none)."""
        return ""

    def greedy_logits(self, model: ModelT, tokens: Tensor, target: Tensor, seed: int) -> Tensor | None:
        """Logits (B, L, V) of the one-step prediction of tokens (B, L) at the ``target`` positions (B, L) bool
        given the rest, whose argmax lm-eval's greedy check compares with the tokens (noise drawn from
        ``seed``); None: the method has no one-step greedy continuation (continuous diffusion)."""
        return None

    def probe(self, model: ModelT, tokens: Tensor, t: float, generator: torch.Generator) -> Probe | None:
        """The network's predictions for tokens (B, L) noised at time ``t`` as in training, with noise from
        ``generator`` (not the training streams), for the plateau signatures; None: not defined (AR, Duo)."""
        return None

    @abstractmethod
    def embedding_rows(self, model: ModelT) -> Tensor:
        """(V, d) float32 token-embedding rows of ``model`` (the vocabulary's, no [MASK]/BOS rows)."""
