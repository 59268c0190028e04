"""The toy study: a fictional world, a tiny model, its warm start, the study and the quickstart."""
