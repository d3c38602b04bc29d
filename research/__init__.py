"""Studies of what the memory buys. Each is a command built on compressive.py, most of them
training or evaluating with train_shakespeare.py and training/ (never the other way round); docs/
holds their reports (REACH.md) and figures, and the tests beside them specify them.

    recall.py       the reach benchmark: python -m research.recall (a text in which reach is all)
    code.py         real text in which reach matters: python -m research.code (Python's library,
                    the corpus built from the interpreter's own standard library)
    copies.py       the loss by copy distance; python -m research.copies FILE profiles a text
    study.py        the code study: python -m research.study run | table (OUT/*/study.json);
                    first, what the studies' commands share (tables, timing, curves, captions)
    reach_cost.py   what each model pays for reach: python -m research.reach_cost
    attention.py    where the attention goes: python -m research.attention --out OUT
    cue.py          an agent's episodes ending anywhere in an unroll: python -m research.cue
    ppo_cue.py      PPO on the cue task, updated on what it acted: python -m research.ppo_cue
    tmaze.py        what compression buys an agent, a T-maze: python -m research.tmaze
    agent_cost.py   acting and the update against compressive.py: python -m research.agent_cost
    tasks.py        which text a checkpoint learned, for the commands that read any checkpoint;
                    python -m research.tasks --out OUT writes it for the lesson (validation.json)
"""
