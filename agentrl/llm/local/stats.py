"""The local engine's counters, popped into the perf/engine_* metrics of each step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    """Counters behind the perf/engine_* metrics (reset by `pop`)."""

    requests: int = 0
    steps: int = 0
    prefill_passes: int = 0
    decode_passes: int = 0
    prompt_tokens: int = 0  # ids of every prompt received
    cached_prompt_tokens: int = 0  # of those, served from the prefix cache
    prefill_tokens: int = 0  # ids run through prefill passes (recomputation included)
    padded_prefill_tokens: int = 0  # positions of prefill passes, padding included
    decode_prompt_tokens: int = 0  # prompt ids run in decode passes (the last id of a cached prompt)
    generated_tokens: int = 0
    decode_rows: int = 0  # sum over decode passes of their batch size
    peak_running: int = 0  # most sequences running in one step
    peak_kv_tokens: int = 0  # most tokens counted against max_total_tokens at once
    seconds: float = 0.0
    # Ids decoded for requests whose caller stopped waiting (an episode cancelled mid-reply):
    # read by the rollout source (`LocalEngine.pop_discarded_tokens`), so `pop` keeps it
    discarded_tokens: int = 0

    def pop(self) -> dict[str, float]:
        """Return perf/* metrics and reset."""
        out = {
            "perf/engine_requests": float(self.requests),
            "perf/engine_steps": float(self.steps),
            "perf/engine_generated_tokens": float(self.generated_tokens),
            "perf/engine_tokens_per_s": self.generated_tokens / self.seconds if self.seconds else 0.0,
            "perf/engine_prefill_tokens": float(self.prefill_tokens),
            "perf/engine_prefix_hit_rate": (self.cached_prompt_tokens / self.prompt_tokens
                                            if self.prompt_tokens else 0.0),
            "perf/engine_mean_decode_batch": (self.decode_rows / self.decode_passes
                                              if self.decode_passes else 0.0),
        }
        # misc: mypy calls an instance's __init__ unsound (a subclass may change it); EngineStats has none
        self.__init__(discarded_tokens=self.discarded_tokens)  # type: ignore[misc]
        return out
