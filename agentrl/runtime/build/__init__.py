"""Building a run's parts from its config: the model-free checks, the env factories and agents, the
policy and its warm start, the engine, the learners, and the trainer that holds them."""
