#!/bin/bash
# The reward is one number in /logs/verifier/reward.txt.
if [ "$(/srv/greet/greet.sh 'Ada Lovelace')" = "Hello, Ada Lovelace!" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
