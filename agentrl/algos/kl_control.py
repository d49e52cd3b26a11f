"""The coefficient of a KL penalty in the reward: fixed, or adaptive (Ziegler et al. 2019)."""

from __future__ import annotations

from agentrl.config import KLControlConfig


class KLController:
    """Holds the current KL coefficient; `update` moves it towards the target (adaptive)."""

    def __init__(self, cfg: KLControlConfig) -> None:
        self.cfg = cfg
        self.value = cfg.kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """After a batch of `n_steps` samples with mean KL `current_kl` (verl's rule)."""
        if self.cfg.type != "adaptive":
            return
        error = min(max(current_kl / self.cfg.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.cfg.horizon
