"""Training: teacher trajectories, SFT datasets through the shared renderer, QLoRA training judged by behaviour.

One module per concern, each importing only modules listed above it (tests/test_architecture.py
forbids any cycle, lazy imports included):

* ``errors``: ``TrainingError``, one line that says how to fix the input.
* ``known_warnings``: the third-party warnings training silences, and why.
* ``memory``: the peak GPU memory estimate of ``explorer train --dry-run``.
* ``config``: ``TrainConfig`` and ``BuildConfig``, every setting with its help text and bounds.
* ``records``: what sft writes (examples, build reports, validation records, summaries, manifests).
* ``teacher``: gold-guided teacher trajectories (``explorer sft teach``).
* ``teach``: ``teach(config, out=...)``, the teacher's workflow over a split's questions.
* ``dataset``: trajectories -> examples (filters, the split by paper, tokenisation).
* ``parity``: built examples checked against the served prompts.
* ``build``: ``build_dataset(config, ...)``, the whole build with its parity and split checks.
* ``model``: the base made trainable with LoRA, and the loss on assistant tokens.
* ``checkpoints``: checkpoint manifests, and which checkpoint a resume continues from.
* ``interrupts``: Ctrl-C saves a checkpoint and stops; the line that says how to resume.
* ``validation``: judging the weights by loss and by behaviour; choosing the checkpoint.
* ``trainer``: the hooks into transformers' Trainer (loss, batching, validation, progress).
* ``train``: ``train(config, data=..., out=...)``, the training workflow.
* ``improve``: ``improve(settings, out=..., corpus=...)``, expert iteration over build and train.
"""
