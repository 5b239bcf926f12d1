"""Load a replaid export with transformers' Auto classes (copied into every exported folder).

    from transformers import AutoModel
    m = AutoModel.from_pretrained("FOLDER_OR_HUB_ID", trust_remote_code=True)  # needs `pip install replaid`
    m.net        # the torch network (RePlaid denoiser, or the token DiT of AR / MDLM / Duo)
    m.method     # its replaid method: eval_bound(...), sample(...)
    m.tokenizer  # the run's tokenizer (encode / decode)

The network, weights and tokenizer come from the installed ``replaid`` package
(``replaid.hub.from_pretrained``); this file only adapts them to ``PreTrainedModel``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from transformers import PretrainedConfig, PreTrainedModel

if TYPE_CHECKING:
    from replaid.store.loading import Run


class ReplaidConfig(PretrainedConfig):  # type: ignore[no-untyped-call]  # transformers' __init_subclass__ is unannotated
    model_type = "replaid"


class ReplaidModel(PreTrainedModel):  # type: ignore[no-untyped-call]  # transformers' __init_subclass__ is unannotated
    config_class = ReplaidConfig
    base_model_prefix = "net"

    def __init__(self, config: PretrainedConfig, run: Run | None = None) -> None:
        super().__init__(config)
        if run is None:  # from_config: a freshly initialised network of the exported shape
            from replaid.hub.export import build_from_hf_config

            net, method = build_from_hf_config(config.to_dict())
            tokenizer = None
        else:
            net, method, tokenizer = run.model, run.method, run.tokenizer
        self.net = net
        self.method = method
        self.tokenizer = tokenizer

    @classmethod
    def from_pretrained(  # type: ignore[override]  # a folder or Hub id only (no None), loaded by replaid itself
        cls,
        pretrained_model_name_or_path: str | os.PathLike[str],
        *model_args: Any,
        config: PretrainedConfig | str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> ReplaidModel:
        """Weights through replaid's own loader (safetensors, strict shape checks)."""
        from replaid.hub import from_pretrained

        run = from_pretrained(pretrained_model_name_or_path, device=str(kwargs.get("device_map") or "cpu"))
        if config is None or not isinstance(config, PretrainedConfig):
            config = ReplaidConfig.from_pretrained(str(run.ckpt))
        model: ReplaidModel = cls(config, run=run).eval()  # type: ignore[no-untyped-call]  # transformers' eval() is unannotated
        return model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The network's own forward (e.g. ``net(z, gamma, e_sc)`` for RePlaid, ``net(ids, t)`` for MDLM)."""
        return self.net(*args, **kwargs)
