"""The bundled trainer package (imported as `atropos_trainer` by `atropos train`; needs torch)."""
