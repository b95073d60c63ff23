#!/bin/bash
# A non-solving agent (bash): reads the issue, looks at the repository, changes nothing.
echo "issue: $(head -n 1 "$TASK_PROMPT")"
ls -R textkit tests
