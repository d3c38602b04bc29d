"""The plumbing of train_shakespeare.py, one job per module, and the commands that use what it
trained. It imports nothing of the script, research/ or lesson/, which build on it (bench.py,
which times the script's own training step, stands beside the script).

    data.py         the text as ids: the shipped Tiny Shakespeare (checked) or --data, split as
                    nanoGPT splits it; the Data a research command brings in the same form
    models.py       the models that --model names, made from a CompressiveConfig
    checkpoint.py   checkpoints written whole, read back as plain data, restored where they fit;
                    a checkpoint's model with less memory (--eval-mem-len); how it was made
    recorded_attention.py
                    each layer's attention weights of a forward, read with forward hooks
    device.py       the device, the dtype (--dtype auto: bf16 where the hardware computes it
                    natively), autocast and the float16 gradient scaler, compiling once the
                    memories are full (eager where compiling fails), an allocator setting
    distributed.py  data parallelism over processes started by torchrun
    files.py        crash-safe writes, a run's metrics.json, a data file read as text
    checks.py       problems the user can fix: flags checked up front, one line per problem
    plots.py        the loss curve, when matplotlib is installed

The commands, each on a checkpoint or a model of the script's flags:

    python -m training.sample     text from a trained model
    python -m training.evaluate   a checkpoint's loss on its whole validation text, its memory cut
                                  or not; evaluate() is the script's validation, per_character()
                                  what the studies read of each character, both one walk
    python -m training.plots OUT  a run's loss curve drawn again from its files

test_train_shakespeare.py specifies the script and all of it.
"""
