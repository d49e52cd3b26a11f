"""Where env, agent and engine meet: trajectories and the collector."""
