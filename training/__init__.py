"""What train_shakespeare.py does beyond training, one job per module:

    checks.py       problems the user can fix: flags checked up front, one line per problem
    device.py       the device, autocast and the float16 gradient scaler, compiling once the
                    memories are full, an allocator setting
    files.py        crash-safe writes; a data file read as text
    data.py         the text of each task, as ids: the shipped Shakespeare or --data, the code
                    corpus, recall
    corpus.py       --task code: a corpus of the interpreter's standard-library sources, built once
    copies.py       the loss by copy distance: which characters a longer reach could help with
    checkpoint.py   checkpoints written whole, read back as plain data, restored where they fit
    distributed.py  data parallelism over processes started by torchrun
    modes.py        --bench, and --sample, --eval-only, --analyze on a checkpoint
    recall.py       the reach benchmark: the recall task, its scoring by distance and by phase
    sample.py       --sample: text from a trained model
    analysis.py     --analyze: where the attention goes, over [c_mem; mem; segment]
    memory_picture.py  --picture: what mem and c_mem hold and where a query looks, drawn from
                    the model's own state (PNG, GIF, JSON); importable for a notebook
    bench.py        --bench: tokens/s, ms per step, peak memory and mfu of training steps
    reach_cost.py   --bench --bench-reach: what each model pays, per step and in memory, for reach
    study.py        the code-corpus study: runs, ablations, its results file and figure
    plots.py        the figures, when matplotlib is installed; python -m training.plots OUT
                    draws a run's again from its files

test_train_shakespeare.py specifies all of it; REACH.md is the reach benchmark's full study, and
the code study's and the cost of reach's; code_study.json holds the code study's runs.
"""
