"""Logprobs and entropies a chunk of positions at a time (actor.logits_chunk_size): an update never
holds every token's full-vocabulary logits in float32, and logprobs, entropies and gradients are
those of the whole-logits pass."""

import copy

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentrl.config import ActorConfig, LoraConfig
from agentrl.models.lora import apply_lora
from agentrl.models.qwen_shape import QWEN_COMMON, QWEN_SHAPES
from agentrl.train.actor import Actor
from agentrl.train.batch import pack
from agentrl.train.forward import logprobs
from agentrl.trajectory import Trajectory

PROMPT = [(11 * k) % 290 + 5 for k in range(20)]  # shared by a group of rows: the prefix-shared pass runs


def _rows():
    """Right-padded (ids, mask): three rows that share PROMPT and one that shares nothing."""
    rows = [PROMPT + [(31 * s + 7 * k) % 290 + 5 for k in range(n)] for s, n in ((1, 6), (2, 13), (3, 2))]
    rows.append([(13 * k) % 290 + 5 for k in range(17)])
    width = max(map(len, rows))
    ids, mask = torch.zeros((len(rows), width), dtype=torch.long), torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
    return ids, mask


def _qwen_shaped():
    """Qwen2.5-0.5B's architecture and 151,936-id vocabulary, narrowed to a test's size (random weights)."""
    narrow = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Qwen2ForCausalLM(Qwen2Config(**{**QWEN_COMMON, **QWEN_SHAPES["qwen2.5-0.5b"], **narrow}))


def _model(which, tiny_model):
    if which == "qwen_shaped":
        return _qwen_shaped().train()
    model = copy.deepcopy(tiny_model)
    if which == "lora":
        model = apply_lora(model, LoraConfig(rank=4, alpha=8.0), seed=0)
        with torch.no_grad():  # adapters start as a no-op (B = 0): make them count
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.normal_(std=0.2)
    return model.train()


def _pass(model, ids, mask, kind, chunk):
    """Logprobs, entropies and the gradients of a loss of both, through one kind of pass."""
    logp, entropy = logprobs(model, ids, mask, 0.7, kind == "packed", with_entropy=True,
                             share_prefixes=kind == "shared", chunk=chunk)
    weights = torch.linspace(-1.0, 1.0, ids.numel()).reshape(ids.shape)
    ((logp * weights * mask).sum() + (entropy * mask).sum() * 0.1).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return logp.detach(), entropy.detach(), grads


@pytest.mark.parametrize("kind", ["padded", "packed", "shared"])
@pytest.mark.parametrize("which", ["tiny", "lora", "qwen_shaped"])
def test_chunked_logprobs_entropies_and_gradients_equal_the_whole_logits(tiny_model, which, kind):
    model = _model(which, tiny_model)
    ids, mask = _rows()
    whole = _pass(model, ids, mask, kind, chunk=0)
    # Chunks cross the rows' ends (each chunk adds its own gradient of the 151,936-row output layer: fewer there).
    chunked = _pass(model, ids, mask, kind, chunk=32 if which == "qwen_shaped" else 5)
    real = mask.bool()
    torch.testing.assert_close(chunked[0][real], whole[0][real], rtol=1e-5, atol=1e-5, msg="logprobs")
    torch.testing.assert_close(chunked[1][real], whole[1][real], rtol=1e-5, atol=1e-5, msg="entropies")
    assert chunked[2].keys() == whole[2].keys() and whole[2]
    for name, g in whole[2].items():
        scale = float(g.abs().max().clamp(min=1.0))  # to 1e-5 of the largest entry: sums in another order
        torch.testing.assert_close(chunked[2][name] / scale, g / scale, rtol=0.0, atol=1e-5, msg=f"gradient of {name}")
    assert max(float(g.abs().max()) for g in whole[2].values()) > 1e-3


def _batch(rows, length, vocab):
    gen = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(rows):
        ids = torch.randint(5, vocab, (length,), generator=gen).tolist()
        mask = [0] * 8 + [1] * (length - 8)
        trajs.append(Trajectory(ids, mask, [0.0] * length, [0] * length, [1.0], [length - 1], i // 2, i))
    batch = pack(trajs, pad_token_id=0)
    batch.advantages = torch.linspace(-1.0, 1.0, batch.loss_mask.numel()).reshape(batch.loss_mask.shape)
    return batch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_chunked_update_steps_as_the_whole_logits_one(tiny_model, dtype):
    steps = {}
    for chunk in (0, 7):
        model = copy.deepcopy(tiny_model).to(dtype)
        cfg = ActorConfig(ppo_mini_batch_size=6, micro_batch_size=3, grad_clip=0.0, entropy_coeff=0.01,
                          logits_chunk_size=chunk)
        actor = Actor(model, cfg, temperature=1.0, horizon=20.0)
        actor.optimizer = torch.optim.SGD(actor.master.params, lr=1e-2)  # a step of lr x gradient: no Adam rescaling
        before = [p.detach().clone() for p in actor.master.params]  # float32 (bfloat16 weights: the master copies)
        batch = _batch(6, 20, len(tiny_model.get_input_embeddings().weight))
        batch.old_logprobs = actor.compute_logprobs(batch)
        stats = actor.update(batch)
        steps[chunk] = stats, [p.detach() - b for p, b in zip(actor.master.params, before)]
    (whole, w_steps), (chunked, c_steps) = steps[0], steps[7]
    assert chunked["loss/policy"] == pytest.approx(whole["loss/policy"], rel=1e-5, abs=1e-7)
    assert chunked["policy/entropy"] == pytest.approx(whole["policy/entropy"], rel=1e-5)
    # bfloat16 gradients are summed in bfloat16, over chunks as over micro-batches: to its precision (2^-8).
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    largest = max(float(s.abs().max()) for s in w_steps)
    assert largest > 1e-4
    for a, b in zip(w_steps, c_steps):
        torch.testing.assert_close(b, a, rtol=0.0, atol=tolerance * largest)


def _peak_bytes(run) -> int:
    """The most bytes torch's CPU allocator held at once while `run` ran, beyond what it held before
    (every allocation and free as the profiler records them: it depends on the shapes only)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    now = peak = 0
    for _, nbytes in events:
        now += nbytes
        peak = max(peak, now)
    return peak


def test_an_update_never_holds_every_tokens_logits_in_float32():
    # Many tokens, a wide vocabulary, a narrow model and short rows: the logits are what costs memory here.
    vocab, rows, length = 4096, 128, 128
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    # The defaults but the batch's size: one micro-batch of every row.
    actor = Actor(model, ActorConfig(micro_batch_size=rows, ppo_mini_batch_size=rows, entropy_coeff=0.01),
                  temperature=1.0, horizon=float(length))
    batch = _batch(rows, length, vocab)
    one_copy = rows * length * vocab * 4  # the (tokens, vocab) float32 logits: 256 MiB
    old = _peak_bytes(lambda: setattr(batch, "old_logprobs", actor.compute_logprobs(batch)))
    update = _peak_bytes(lambda: actor.update(batch))
    # The whole-logits pass held 2 such copies at once for the old logprobs, 5 in the update.
    assert old < one_copy and update < one_copy, \
        f"peaks: old logprobs {old / 2**20:.0f} MiB, update {update / 2**20:.0f} MiB"
