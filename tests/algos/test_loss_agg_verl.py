"""actor.loss_agg_mode=seq-mean-token-sum-norm means verl's agg_loss (verl PR #5366): every summed
token loss of the mini-batch / horizon (loss_scale_factor), with no division by the number of
sequences; dr-grpo (the Dr. GRPO paper, TRL's dr_grpo) also averages over the sequences.

By hand on small tensors, through the loop reference, and through the actor, where the policy
term, the KL loss term and the entropy term all use the mode (issue 14, item 2).
"""

from types import SimpleNamespace

import pytest
import torch

from agentrl.algos import reference_losses as ref
from agentrl.algos.losses import aggregate
from agentrl.config import ActorConfig
from agentrl.train.actor import Actor
from agentrl.train.batch import Batch

LOSS = [[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]]
MASK = [[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]  # row 2: no generated id


def test_verl_mode_sums_every_token_loss_over_the_horizon():
    loss = torch.tensor(LOSS, requires_grad=True)
    # verl's agg_loss: (1 + 2 + 3 + 4) / loss_scale_factor 8; no division by the 2 sequences
    value = aggregate(loss, torch.tensor(MASK), "seq-mean-token-sum-norm", horizon=8.0)
    assert value.item() == pytest.approx(10 / 8)
    value.backward()
    assert torch.equal(loss.grad, torch.tensor(MASK) / 8)  # each generated token counts 1/8
    # verl's default divisor is the mask's last dimension (its padded response length): 4 here
    assert float(aggregate(torch.tensor(LOSS), torch.tensor(MASK), "seq-mean-token-sum-norm")) == pytest.approx(10 / 4)


def test_dr_grpo_mode_averages_sequence_sums_over_the_horizon():
    loss = torch.tensor(LOSS, requires_grad=True)
    got = aggregate(loss, torch.tensor(MASK), "dr-grpo", horizon=8.0)
    assert got.item() == pytest.approx(10 / (2 * 8))  # two sequences with generated ids
    got.backward()
    assert torch.equal(loss.grad, torch.tensor(MASK) / 16)  # each generated token counts 1/(2 * 8)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm", "dr-grpo"])
def test_aggregate_matches_the_loop_reference(mode):
    torch.manual_seed(0)
    loss = torch.randn(4, 6)
    mask = (torch.rand(4, 6) > 0.4).float()
    want = ref.aggregate(loss.tolist(), mask.tolist(), mode, 6.0)
    assert float(aggregate(loss, mask, mode, horizon=6.0)) == pytest.approx(want, rel=1e-6)


# ------------------------------------------------------------------ through the actor
class BiasModel(torch.nn.Module):
    """Logits = a learned bias per position and vocabulary entry: a model the actor can update."""

    def __init__(self, width: int = 5, vocab: int = 4) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(width, vocab, generator=torch.Generator().manual_seed(0)))

    def forward(self, input_ids, attention_mask):
        return SimpleNamespace(logits=self.bias[: input_ids.shape[1]].expand(input_ids.shape[0], -1, -1))


def _batch(n: int) -> Batch:
    ids = torch.tensor([[0, 1, 2, 3, 1]] * n)
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0]] * n)
    zeros = torch.zeros(n, 5)
    return Batch(input_ids=ids, attention_mask=torch.ones_like(ids), loss_mask=mask, behaviour_logprobs=zeros,
                 token_rewards=zeros, versions=torch.zeros_like(ids), group_index=torch.zeros(n, dtype=torch.long),
                 state_ids=-torch.ones_like(ids), old_logprobs=zeros - 1.0, ref_logprobs=zeros - 2.0,
                 advantages=mask * 0.5)


@pytest.mark.parametrize("term", ["policy", "kl", "entropy"])
def test_actor_terms_of_the_verl_mode_are_not_divided_by_the_sequence_count(term):
    # Three identical sequences. Under verl's mode each term is 3x the Dr. GRPO form's, so are
    # the loss and the gradient norm: nothing is divided by the number of sequences.
    extra = {"policy": {}, "kl": {"use_kl_loss": True, "kl_loss_coef": 1.0},
             "entropy": {"entropy_coeff": 1.0}}[term]
    out = {}
    for mode in ("seq-mean-token-sum-norm", "dr-grpo"):
        batch = _batch(3)
        if term != "policy":
            batch.advantages = torch.zeros_like(batch.advantages)  # leave only the tested term
        cfg = ActorConfig(lr=0.0, loss_agg_mode=mode, loss_scale_factor=8.0, grad_clip=0.0,
                          ppo_mini_batch_size=3, micro_batch_size=1, **extra)
        out[mode] = Actor(BiasModel(), cfg, temperature=1.0).update(batch)
    verl, drgrpo = out["seq-mean-token-sum-norm"], out["dr-grpo"]
    assert verl["loss/policy"] != 0.0
    assert verl["loss/policy"] == pytest.approx(3 * drgrpo["loss/policy"], rel=1e-6)
    assert verl["policy/grad_norm"] == pytest.approx(3 * drgrpo["policy/grad_norm"], rel=1e-6)


@pytest.mark.parametrize("mode, want", [("dr-grpo", -0.5 * 6 / (2 * 8)),
                                        ("seq-mean-token-sum-norm", -0.5 * 6 / 8)])
def test_actor_policy_loss_by_hand(mode, want):
    # Two sequences of 3 generated ids, logp == old (ratio 1), A = 0.5: each token's loss is -0.5;
    # verl: (-0.5 * 3 - 0.5 * 3) / loss_scale_factor 8; Dr. GRPO also / 2 sequences; whatever the
    # micro-batch split.
    batch = _batch(2)
    model = BiasModel()
    with torch.no_grad():
        logits = model(batch.input_ids, None).logits[:, :-1]
        logp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    batch.old_logprobs = torch.nn.functional.pad(logp, (1, 0))
    cfg = ActorConfig(lr=0.0, loss_agg_mode=mode, loss_scale_factor=8.0,
                      ppo_mini_batch_size=2, micro_batch_size=1)
    stats = Actor(model, cfg, temperature=1.0).update(batch)
    assert stats["loss/policy"] == pytest.approx(want, rel=1e-6)
