"""The SAO learner: train state, the pure train step, its compilation."""
