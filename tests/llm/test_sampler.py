"""Per-request sampling: inverse-CDF on one uniform, filters, logprobs at the request's temperature."""

import torch

from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.sampler import filter_top_k_top_p, sample_next, stop_string_hit


def test_inverse_cdf_picks_by_the_uniform_and_reports_scaled_logprobs():
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.7], [0.1, 0.2, 0.7]]))
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.5)]
    tokens, lps = sample_next(logits, params, [0.05, 0.99])
    assert tokens == [0, 2]
    assert lps[0] == torch.log(torch.tensor(0.1)).item()
    expected = torch.log_softmax(logits[1] / 0.5, -1)[2].item()
    assert abs(lps[1] - expected) < 1e-6


def test_greedy_takes_the_argmax_whatever_the_uniform():
    logits = torch.tensor([[0.0, 3.0, 1.0]])
    tokens, lps = sample_next(logits, [SamplingParams(greedy=True, temperature=0.1)], [0.0])
    assert tokens == [1] and abs(lps[0] - torch.log_softmax(logits[0], -1)[1].item()) < 1e-6


def test_top_k_and_top_p_restrict_what_is_sampled():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = filter_top_k_top_p(logits, [2], [1.0]).isfinite()[0].tolist()
    assert kept == [True, True, False, False]
    kept = filter_top_k_top_p(logits, [0], [0.7]).isfinite()[0].tolist()
    assert kept == [True, True, False, False]  # 0.5 < 0.7, and the token crossing it stays
    tokens, _ = sample_next(logits, [SamplingParams(top_p=0.7)], [0.999])
    assert tokens == [1]


def test_stop_string_is_found_when_completed(tiny_tokenizer):
    tok = tiny_tokenizer
    ids = tok.encode("<answer>Left</answer> and more", add_special_tokens=False)
    hits = [stop_string_hit(tok, ids[: k + 1], ("</answer>",)) for k in range(len(ids))]
    first = next(k for k, h in enumerate(hits) if h)
    assert "</answer>" in tok.decode(ids[: first + 1]) and "</answer>" not in tok.decode(ids[:first])
    assert not any(hits[first + 1:])  # later ids do not complete it again
