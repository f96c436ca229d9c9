"""One module per fault; each exposes ``run(...) -> dict`` with the scenario's figures."""
