#!/bin/bash
# The digits reproduction table's rows, each into its own folder; the weights trained once and reused.
cd /tmp/repro
set -x
hcrfast reproduce digits --out default --no-progress 2>&1 | tail -2
W=default/digits_state_dict.pt
hcrfast reproduce digits --weights $W --out ss0 --singular-steps 0 --no-progress 2>&1 | tail -1
hcrfast reproduce digits --weights $W --out t8 --targets low:8 --no-progress 2>&1 | tail -1
hcrfast reproduce digits --weights $W --out ss0_t8 --singular-steps 0 --targets low:8 --no-progress 2>&1 | tail -1
hcrfast reproduce digits --weights $W --out lsqr --solver lsqr --no-progress 2>&1 | tail -1
hcrfast reproduce digits --weights $W --out lsqr_t8 --solver lsqr --targets low:8 --no-progress 2>&1 | tail -1
hcrfast reproduce digits --weights $W --out lsqr_cold --solver lsqr --cold-start --no-progress 2>&1 | tail -1
hcrfast reproduce digits --weights $W --out lsqr_cold_t8 --solver lsqr --cold-start --targets low:8 --no-progress 2>&1 | tail -1
echo ALLDONE
