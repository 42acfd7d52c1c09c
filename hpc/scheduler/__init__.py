"""Talking to Slurm and finding jobs: the scheduler calls (on launcher/contracts/slurm.py), its state watch, and the job index."""
