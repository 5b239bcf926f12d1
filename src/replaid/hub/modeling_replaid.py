"""Load a replaid export with transformers' Auto classes (copied into every exported folder).

    from transformers import AutoModel
    m = AutoModel.from_pretrained("FOLDER_OR_HUB_ID", trust_remote_code=True)  # needs `pip install replaid`
    m.net        # the torch network (RePlaid denoiser, or the token DiT of AR / MDLM / Duo)
    m.method     # its replaid method: eval_bound(...), sample(...)
    m.tokenizer  # the run's tokenizer (encode / decode)

The network, weights and tokenizer come from the installed ``replaid`` package
(``replaid.hub.from_pretrained``); this file only adapts them to ``PreTrainedModel``.
"""

from transformers import PretrainedConfig, PreTrainedModel


class ReplaidConfig(PretrainedConfig):
    model_type = "replaid"


class ReplaidModel(PreTrainedModel):
    config_class = ReplaidConfig
    base_model_prefix = "net"

    def __init__(self, config, run=None):
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
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config=None, **kwargs):
        """Weights through replaid's own loader (safetensors, strict shape checks)."""
        from replaid.hub import from_pretrained

        run = from_pretrained(pretrained_model_name_or_path, device=str(kwargs.get("device_map") or "cpu"))
        if config is None or not isinstance(config, PretrainedConfig):
            config = ReplaidConfig.from_pretrained(str(run.ckpt))
        return cls(config, run=run).eval()

    def forward(self, *args, **kwargs):
        """The network's own forward (e.g. ``net(z, gamma, e_sc)`` for RePlaid, ``net(ids, t)`` for MDLM)."""
        return self.net(*args, **kwargs)
