"""Helpers shared by the bundled envs (dataset loading, answer extraction). Not an env: the registry skips `_*`."""
