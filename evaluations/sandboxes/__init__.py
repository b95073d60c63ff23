"""Live sandboxes (SPEC §24): one long-lived bubblewrap per sandbox, with a small init of ours inside.

- ``initbin``: builds that init (``init.c``) once per host, static, bound read-only into each sandbox.
- ``channel``: the host's end of the init's socket: start an exec, signal it, hear how it ended.
- ``control``: how the API reaches the process that owns a sandbox (a Unix socket per sandbox).
- ``spec``: the POST /sandboxes body, checked.
- ``host``: that process: prepares the environment, runs the sandbox, answers exec, files, network.
- ``files``: file transfer, every path resolved inside the sandbox's root (SPEC §21).
"""
