"""Live sandboxes (SPEC §24): one long-lived bubblewrap per sandbox, with a small init of ours inside.

- The init itself, its build and the host's end of its socket are the runtime's
  (``runtime/init.c``, ``runtime/initbin.py``, ``runtime/initchannel.py``): the pipeline's phases use them too (SPEC §25).
- ``control``: how the API reaches the process that owns a sandbox (a Unix socket per sandbox).
- ``spec``: the POST /sandboxes body, checked.
- ``host``: that process: prepares the environment, runs the sandbox, answers exec, files, network.
- ``files``: file transfer, every path resolved inside the sandbox's root (SPEC §21).
"""
