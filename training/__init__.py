"""The plumbing of train_shakespeare.py that a reader may skip, one job a module (each names its
own); it imports nothing of the script, the commands beside it, research/ or lesson/."""
