"""Building a run's parts from its config: the model-free checks, the env factories and agents, the
policy (its warm start has a room of its own: warm_start/), the engine, the learners, and the
trainer that holds them."""
