"""Studies of what the memory buys, each a command that uses the training code (train_shakespeare.py
and training/), never the other way round. docs/ holds their reports and figures."""
