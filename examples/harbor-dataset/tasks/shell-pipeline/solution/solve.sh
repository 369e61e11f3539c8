#!/bin/bash
grep '^a' /app/words.txt | sort -u | wc -l > /app/count.txt
