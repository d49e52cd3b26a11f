"""The vLLM wire's reading of a reply: per-id versions from `weight_versions` spans, the adapter name."""

import pytest

from agentrl.errors import EngineError
from agentrl.llm.engine import SamplingParams
from agentrl.llm.remote.wire import VllmWire


def reply(ids, spans):
    content = [{"token_id": t, "logprob": -1.0} for t in ids]
    return {"choices": [{"token_ids": ids, "finish_reason": "length", "stop_reason": None,
                         "logprobs": {"content": content}, "weight_versions": spans}]}


def test_a_reply_spanning_a_sync_carries_each_ids_version():
    wire = VllmWire()
    wire.server_versions = True
    spans = [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 5}]
    done = wire.completion(reply([7, 8, 9, 10, 11], spans), version=4)
    assert done.versions == [3, 3, 4, 4, 4] and done.policy_version == 4 and done.kv_version == 3


def test_without_server_versions_ids_carry_the_version_at_send():
    spans = [{"version": "default", "start": 0, "end": 2}]
    assert VllmWire().completion(reply([7, 8], spans), version=2).versions == [2, 2]


def test_a_label_that_is_not_ours_is_an_error_naming_it():
    wire = VllmWire()
    wire.server_versions = True
    with pytest.raises(EngineError, match="weights version 'default', not a number of ours"):
        wire.completion(reply([7], [{"version": "default", "start": 0, "end": 1}]), version=0)


def test_spans_that_miss_ids_are_an_error():
    wire = VllmWire()
    wire.server_versions = True
    with pytest.raises(EngineError, match="do not cover its 3 ids"):
        wire.completion(reply([7, 8, 9], [{"version": "1", "start": 0, "end": 2}]), version=1)


def test_an_adapter_name_goes_with_every_request():
    wire = VllmWire()
    assert "model" not in wire.generate_body([1, 2], SamplingParams())
    wire.model = "policy-v3"
    assert wire.generate_body([1, 2], SamplingParams())["model"] == "policy-v3"
