#!/bin/bash
# Harbor's contract: the reward is what /logs/verifier/reward.json says; this script's exit status
# says nothing. pytest writes a JUnit report; reward.py turns it into the reward.
cd /app || exit 1
/opt/verifier/bin/pytest /tests/test_report.py -rA -p no:cacheprovider --junitxml=/logs/verifier/junit.xml
/opt/verifier/bin/python /tests/reward.py /logs/verifier/junit.xml > /logs/verifier/reward.json
