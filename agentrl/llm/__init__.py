"""Token-exact conversations and inference engines."""
