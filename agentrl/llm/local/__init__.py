"""The in-process engine: continuous batching over a slot KV cache, prefix reuse, sampling."""
