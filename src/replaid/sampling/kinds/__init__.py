"""This repository's method kinds, one file each: :mod:`.continuous`, :mod:`.masked`, :mod:`.uniform`,
:mod:`.autoregressive`. Each declares its :class:`~replaid.sampling.strategy.KindStrategy` as ``STRATEGY``,
which :class:`~replaid.methods.base.Kind` names (``kind.strategy``)."""
