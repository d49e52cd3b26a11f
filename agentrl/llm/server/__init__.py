"""The policy over HTTP: OpenAI's and vLLM's routes, our own control routes, per-episode sessions."""
