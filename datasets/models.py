"""Datasets: saved filters over turns, immutable versions, JSONL export and import."""
