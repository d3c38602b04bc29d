"""The plumbing of train_shakespeare.py, which a reader may skip: one job a module. It imports
nothing of the script, of the commands beside it (sample.py, evaluate.py, bench.py), of research/
or of lesson/, which build on it.

    data.py         the text as ids, its files checked: Tiny Shakespeare (shipped) or --data
    checkpoint.py   ckpt.pt written whole and sealed with a digest, read back as plain data;
                    the one function that builds a model from its config
    evaluate.py     the loss on the whole validation text, as the model is trained
    checks.py       flags, device, dtype and processes settled; errors as one line
    files.py        crash-safe writes; the commit a result was made at
    plots.py        the loss curve, when matplotlib is installed
    recorded_attention.py   each layer's attention weights, read with forward hooks
"""
