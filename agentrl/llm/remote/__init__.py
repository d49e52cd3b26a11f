"""The client of inference servers (agentrl serve, vLLM, SGLang): the engine contract over HTTP."""
