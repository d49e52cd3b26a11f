"""Pure functions on (batch, tokens) tensors: advantages and losses."""
