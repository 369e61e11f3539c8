#!/bin/bash
# 1 when /app/count.txt holds the number of distinct a-words (4: almond apple apricot avocado).
mkdir -p /logs/verifier
if [ "$(tr -d '[:space:]' < /app/count.txt 2>/dev/null)" = "4" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
