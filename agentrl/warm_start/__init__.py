"""The warm start of the embedded default model: its tokenizer, its model and the demonstrations
it is fitted on (recipe.py), the fit itself (fit.py), and what seed-style tags give it (seeds.py)."""
