#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the image (an Ubuntu image whose python3
# torch $torch supports). It needs the network (apt, the Python package index, torch's
# index); grading needs none. The CPU build of torch, and pytest, as the checks were computed
# (gradescope.py writes their versions into the bundle's copy of this file).
set -euo pipefail
apt-get update
apt-get install -y python3 python3-venv bubblewrap libseccomp2
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --no-cache-dir torch==$torch --index-url https://download.pytorch.org/whl/cpu
/autograder/venv/bin/pip install --no-cache-dir pytest==$pytest
/autograder/venv/bin/pip install --no-cache-dir -r /autograder/source/teachers_kit/requirements.txt
