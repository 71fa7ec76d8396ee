"""Sub-commands of ``ioe``: one module each, each with ``register(app)``."""
