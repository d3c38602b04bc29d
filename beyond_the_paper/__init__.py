"""Beyond the paper: what this project adds to compressive.py, each module opt-in.

    feedback.py      the Feedback Transformer (Fan et al. 2020), the model to compare with
    agent.py         an agent's memory: episodes that begin anywhere in a call, a reset per row,
                     and acting one step at a time with the memory's keys and values kept
    overlap_pool.py  this project's own f_c: max pooling over windows of c + 1

Each imports compressive.py; compressive.py imports none of them. A copier of the paper's model
takes compressive.py alone; an agent builder takes compressive.py and agent.py.
"""
