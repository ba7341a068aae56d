"""Training jobs: configs, providers, submissions."""
