"""Checkpoint versions: the registry, validation, and the watchdog that activates them."""

# The checkpoint format's manifest (file sizes and sha256s), written by the model's save and read by
# the registry. Here rather than in yue2_jobs.model so that the registry (and every `yue2` command,
# whose parser includes it) does not import torch.
MANIFEST = "manifest.json"
