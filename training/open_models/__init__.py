"""Open models trained on the studio's own machines with TRL, and served by an existing
engine (docs/training.md, "Open models"). Everything here imports torch, transformers and
TRL lazily: they are the `.[train]` extra, which `make demo` does not install."""
