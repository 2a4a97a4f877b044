"""Offline DPO, a mode on the trainer core: :class:`~hybrid_rl.trainer.dpo.trainer.DPOTrainer`
(:mod:`.trainer`), configured by :class:`~hybrid_rl.trainer.dpo.config.DPOConfig` (``main_dpo``),
checked by :mod:`.checks`, its steps' batch keys in :mod:`.contracts`."""
