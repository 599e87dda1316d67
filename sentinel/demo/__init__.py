"""The demo: a tiny GPT-like model trained on synthetic data with an injected fault."""
