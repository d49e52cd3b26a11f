"""Policy models: the embedded tiny default and local Hugging Face checkpoints."""
