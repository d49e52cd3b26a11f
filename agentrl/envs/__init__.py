"""Text environments (contract in base.py); the runtime imports the built-in ones to register them."""
