#!/usr/bin/env bash
# The physical limit of one bench evaluation: the same download, clone, agent and
# tests the executor does, as a plain shell script (no sandbox, no database, no
# limits). Usage: baseline.sh TASK_URL AGENT_FILE; exits 0 when every test passed.
set -euo pipefail
# The system's interpreters, as the executor's commands get them (a pyenv shim costs ~50 ms a call).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
task_url=$1
agent=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-baseline-XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
curl -sSf "$task_url" | tar -xzf -
repo=$(sed -n 's/^repo: *//p' task/workspace.yaml)
base=$(sed -n 's/^base_commit: *//p' task/workspace.yaml)
git clone --quiet --no-checkout -- "$repo" repo
git -C repo -c advice.detachedHead=false checkout --quiet --detach "$base"
cd repo
python3 "$agent" --instruction "$(cat ../task/prompt.md)" >../agent.log 2>&1
failed=0
for test in ../task/tests/*.sh; do
  bash "$test" >"../$(basename "$test").log" 2>&1 || failed=1
done
exit $failed
