#!/usr/bin/env bash
# The physical limit of a warm evaluation: only the agent and the tests, on a copy already cloned
# and installed (bench/cache.py prepares it once). The repository is put back to the base first
# (git checkout), so every run starts where an evaluation from a snapshot starts.
# Usage: warm_baseline.sh PREPARED_DIR AGENT_FILE; exits 0 when every test passed.
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
prepared=$1
agent=$2
export VIRTUAL_ENV=$prepared/venv HOME=$prepared/home PYTHONDONTWRITEBYTECODE=1
export PATH=$VIRTUAL_ENV/bin:$PATH
cd "$prepared/repo"
git checkout --quiet -- .
python3 "$agent" --instruction "$(cat ../task/prompt.md)" >../agent.log 2>&1
failed=0
for test in ../task/tests/*.sh; do
  bash "$test" >"../$(basename "$test").log" 2>&1 || failed=1
done
exit $failed
