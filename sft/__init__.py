"""Training: teacher trajectories, SFT datasets through the shared renderer, QLoRA training judged by behaviour."""
