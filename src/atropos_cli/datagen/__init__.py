"""Rejection sampling (`atropos sft-gen` / `dpo-gen`): `select` turns scored groups into SFT rows and DPO pairs."""
