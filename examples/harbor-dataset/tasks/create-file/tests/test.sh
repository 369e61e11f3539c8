#!/bin/bash
# 1 when /app/greeting.txt holds exactly "hello from harbor", else 0.
mkdir -p /logs/verifier
if [ "$(cat /app/greeting.txt 2>/dev/null)" = "hello from harbor" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
