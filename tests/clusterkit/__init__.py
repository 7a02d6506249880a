"""Real cluster software for the tests: a local SLURM, a container image, a gcloud stand-in."""
