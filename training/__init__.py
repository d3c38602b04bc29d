"""The plumbing of train_shakespeare.py, which a reader may skip, one job a module: the text and
its files checked (data), checkpoints sealed and read as data (checkpoint), the whole-text
validation (evaluate), flags, device, dtype, processes and one-line errors (checks), crash-safe
writes (files), the loss curve (plots), attention read with hooks (recorded_attention). It
imports nothing of the script, the commands beside it, research/ or lesson/."""
