"""The mathematics: noise schedule, NELBO terms, denoiser interface, samplers, oracle. No I/O."""
