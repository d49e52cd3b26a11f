"""vLLM as the rollout engine: a server process of ours (launch.py), its RL control routes
(control.py), our weight transport that vLLM's worker imports (transfer.py) and the
`InferenceEngine` over it all, with its restarts and its logprob probe (engine.py).

Only transfer.py imports vLLM, and only vLLM's own worker process imports transfer.py (through
`--worker-extension-cls`): agentrl's side talks to vLLM over HTTP and never needs it installed.
"""
