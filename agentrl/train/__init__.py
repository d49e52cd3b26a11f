"""Training: packing, actor updates, checkpoints and the step loop."""
