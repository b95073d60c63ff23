# term-executor: the API and the worker in one container, started by the README's command (bin/serve).
#
#   docker build -t term-executor .
#   docker run -d --name term-executor -p 8080:8080 \
#     -v te-data:/data -v te-sessions:/workspaces -e AUTH_TOKEN=change-me \
#     --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#     --security-opt systempaths=unconfined term-executor
#
# The sandbox (bubblewrap) creates user, pid, network, ipc and mount namespaces
# and mounts a fresh /proc. Docker's default seccomp profile forbids the first,
# its AppArmor profile forbids mounts, and its masked /proc paths make the
# kernel refuse a new /proc: hence the three --security-opt flags. No
# --privileged and no capability is needed: bubblewrap runs unprivileged, as
# the container's user. SANDBOX=bwrap below makes the service refuse to start
# when the sandbox does not work, rather than run untrusted code without it.
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap socat git nodejs tini util-linux procps ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# The toolchains of SWE-Forge's task languages (SPEC §19), as the upstream executor's image carries them:
# Go, Node with npm, yarn and pnpm, Rust with cargo, and a JDK (javac) for Java. A task's commands find
# them on the system PATH; LANGUAGE_ENVIRONMENTS sends a language elsewhere (another version, an image).
# Without this layer a task of those languages fails at downloading_task naming its language.
RUN apt-get update \
 && apt-get install -y --no-install-recommends golang-go npm rustc cargo default-jdk-headless build-essential \
 && npm install -g --no-fund --no-audit yarn@1 pnpm@9 \
 && npm cache clean --force \
 && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin executor
WORKDIR /app

# The pinned requirements first: this layer is rebuilt only when they change.
COPY requirements.txt ./
COPY bin/ bin/
RUN bash -c 'source bin/bootstrap requirements.txt'

COPY manage.py ./
COPY executor_project/ executor_project/
COPY evaluations/ evaluations/
COPY assets/ assets/
COPY examples/ examples/

# The code and the virtualenv stay root's, read-only to the service; its state lives in the volumes.
ENV DATA_DIR=/data WORKSPACE_BASE=/workspaces PORT=8080 SANDBOX=bwrap \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN mkdir -p /data /workspaces && chown executor:executor /data /workspaces
VOLUME ["/data", "/workspaces"]
USER executor
EXPOSE 8080

HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:${PORT}/health', timeout=4)"

# tini is PID 1: it forwards SIGTERM to bin/serve (which stops gunicorn and the worker gracefully) and reaps zombies.
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["bin/serve"]
