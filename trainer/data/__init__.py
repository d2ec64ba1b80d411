"""Data: where the trainer's batches of scored groups come from.

Owns rollout files and the trajectory API as batch sources, and the checks and rank-0 broadcast that go with
them (`sources.py`), and env workers sampling groups in-process from an inference engine (`rollouts.py`).
"""
