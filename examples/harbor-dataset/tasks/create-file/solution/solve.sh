#!/bin/bash
printf 'hello from harbor\n' > /app/greeting.txt
