#!/bin/bash
set -euo pipefail
cd /app
tr 'A-Z' 'a-z' < input.txt | tr -c 'a-z\n' ' ' | tr -s ' ' '\n' | grep -v '^$' \
  | sort | uniq -c | sort -k1,1nr -k2,2 | head -5 | awk '{print $2, $1}' > top5.txt
