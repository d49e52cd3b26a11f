"""Data-parallel updates (train/parallel.py): two gloo ranks, each on its share of every
mini-batch, give the loss and the updated weights of one worker on the whole batch."""

import datetime
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import leave_rank, watch_rank

from agentrl.config import ActorConfig, TinyModelConfig
from agentrl.models.tiny import build_model
from agentrl.train.actor import Actor
from agentrl.train.batch import Batch
from agentrl.train.parallel import DataParallel, merge_stats

SHAPE = TinyModelConfig(hidden_size=32, num_hidden_layers=1, intermediate_size=64, num_attention_heads=2,
                        num_key_value_heads=1, vocab_size=300)


class _Vocab:  # what build_model reads of a tokenizer
    pad_token_id, eos_token_id = 0, 1

    def __len__(self):
        return 300


def _batch(rows: int, seed: int = 0, prompt: int = 0) -> Batch:
    """Right-padded sequences with generated spans and non-zero advantages; the first `prompt`
    ids are every row's."""
    g = torch.Generator().manual_seed(seed)
    width = 12 + prompt
    lengths = torch.randint(6 + prompt, width + 1, (rows,), generator=g)
    attn = (torch.arange(width)[None] < lengths[:, None]).long()
    ids = torch.randint(3, 300, (rows, width), generator=g)
    ids[:, :prompt] = ids[0, :prompt]
    ids = ids * attn
    mask = ((torch.arange(width)[None] >= 3) & attn.bool()).float()
    zeros = torch.zeros(rows, width)
    return Batch(ids, attn, mask, zeros.clone(), zeros.clone(), torch.zeros(rows, width, dtype=torch.long),
                 torch.arange(rows), torch.full((rows, width), -1), advantages=torch.randn(rows, width, generator=g),
                 old_logprobs=None)


def _actor(cfg: ActorConfig) -> Actor:
    return Actor(build_model(SHAPE, _Vocab(), seed=0), cfg, temperature=1.0, horizon=10.0)


CASES = [  # (loss_agg_mode, rows, shared prompt); mini-batches of 4 rows
    ("token-mean", 4, 0),  # one mini-batch, split between the ranks
    ("seq-mean-token-sum-norm", 1, 0),  # rank 1 has no row: it joins the all-reduce with a zero-weighted pass
    ("token-mean", 7, 0),  # two optimizer steps (gradients compared at the last)
    ("token-mean", 4, 20),  # actor.share_prefixes: each rank's two rows compute their prompt once
]


def _config(mode: str, prompt: int = 0) -> ActorConfig:
    return ActorConfig(ppo_mini_batch_size=4, micro_batch_size=1 if not prompt else 2, loss_agg_mode=mode, lr=1e-2,
                       share_prefixes=bool(prompt))


def _update(actor: Actor, rows: int, prompt: int = 0) -> dict:
    batch = _batch(rows, prompt=prompt)
    batch.old_logprobs = actor.compute_logprobs(batch) - 0.05  # ratios off 1: the clip is exercised
    stats = actor.update_stats(batch)
    grads = {n: p.grad.clone() for n, p in actor.model.named_parameters()}  # the last mini-batch's, clipped
    return {"stats": stats, "weights": actor.model.state_dict(), "grads": grads}


def _rank(rank: int, world: int, port: int, out: str) -> None:
    watch_rank()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    results = []
    for mode, rows, prompt in CASES:
        actor = _actor(_config(mode, prompt))
        actor.parallel = DataParallel(actor.model, rank, world)
        results.append(_update(actor, rows, prompt))
    torch.save(results, f"{out}/rank{rank}.pt")
    leave_rank()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_update_as_one_worker_on_the_whole_batch(tmp_path):
    torch.set_num_threads(1)
    mp.spawn(_rank, args=(2, _free_port(), str(tmp_path)), nprocs=2)
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for case, (mode, rows, prompt) in enumerate(CASES):
        single = _actor(_config(mode))  # one worker, no sharing
        one = _update(single, rows, prompt)
        ranks = [results[case] for results in per_rank]
        got, want = merge_stats([r["stats"] for r in ranks]), merge_stats([one["stats"]])
        assert got["loss/policy"] == pytest.approx(want["loss/policy"], rel=1e-5, abs=1e-7), (mode, rows)
        assert got["policy/grad_norm"] == pytest.approx(want["policy/grad_norm"], rel=1e-5) and want["policy/grad_norm"] > 0
        for name, grad in one["grads"].items():
            for r in ranks:  # every rank holds the one worker's gradient, summed from both shares
                assert torch.allclose(r["grads"][name], grad, rtol=1e-4, atol=1e-7), (mode, rows, name)
                if rows > 4:
                    continue
                # AdamW's first step moves a weight by about lr * sign(gradient): a weight whose
                # gradient is float noise (k_proj.bias: attention ignores a shift of every key) may
                # move either way; every weight with a real gradient lands where the worker's does.
                real = grad.abs() > 1e-6
                assert torch.allclose(r["weights"][name][real], one["weights"][name][real], atol=1e-6, rtol=0), name
        assert all(torch.equal(ranks[0]["weights"][k], ranks[1]["weights"][k]) for k in ranks[0]["weights"])


def test_merged_stats_sum_the_loss_and_average_the_rest():
    got = merge_stats([{"loss/policy": [1.0, 2.0], "policy/entropy": [1.0, 1.0]},
                       {"loss/policy": [0.5, 0.5], "policy/entropy": [4.0]}])
    assert got == {"loss/policy": 2.0, "policy/entropy": 2.0}
