"""What train_shakespeare.py does beyond training, one job per module:

    checks.py       problems the user can fix: flags checked up front, one line per problem
    files.py        crash-safe writes; the data file, downloaded once (checksummed), read as text
    checkpoint.py   checkpoints written whole, read back as plain data, restored where they fit
    distributed.py  data parallelism over processes started by torchrun
    recall.py       the reach benchmark: the recall task, its scoring by distance and by phase
    sample.py       --sample: text from a trained model
    analysis.py     --analyze: where the attention goes, over [c_mem; mem; segment]
    bench.py        --bench: tokens/s, ms per step, peak memory and mfu of training steps
    plots.py        the figures, when matplotlib is installed
"""
