#!/bin/bash
# 1 when mean() is right on a few lists, else 0.
mkdir -p /logs/verifier
if python3 - <<'PY'
import sys
sys.path.insert(0, "/app")
from stats import mean
assert mean([2, 4]) == 3
assert mean([5]) == 5
assert abs(mean([1, 2, 3, 4]) - 2.5) < 1e-9
PY
then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
