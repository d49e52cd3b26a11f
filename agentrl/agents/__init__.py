"""Agents own the conversation (contract in base.py); the runtime imports the built-in ones."""
