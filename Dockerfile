# term-executor: the API and the worker in one container, started by the README's command (bin/serve).
# Everything the service does on a host it does here (docs/operating.md, "Docker", says why each flag):
#
#   docker build -t term-executor .          # or: podman build --format docker -t term-executor .
#   docker run -d --name term-executor -p 8080:8080 \
#     -v te-data:/data -v te-sessions:/workspaces -e AUTH_TOKEN=change-me \
#     --cap-add SYS_ADMIN --cap-add SYS_PTRACE --cap-add MKNOD \
#     --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#     --security-opt systempaths=unconfined term-executor
#
# The service runs as the container's root, as it does on a host: each evaluation and live sandbox gets a
# uid of its own (SANDBOX_UID..) and, for an image task, an id range (IMAGE_UID_BASE..) it is root in name
# only in; bubblewrap makes user, pid, network, ipc and mount namespaces and a fresh /proc. The image
# pipeline mounts each image's layers (overlay, idmapped mounts): CAP_SYS_ADMIN; the service finds and
# kills each evaluation's processes by /proc/<pid>/environ and opens their /proc/<pid>/ns, a ptrace read
# check for another uid: CAP_SYS_PTRACE; unpacking a layer makes whiteouts (device 0:0): CAP_MKNOD.
# Docker's seccomp profile forbids new user namespaces, its AppArmor profile mounts, and its masked /proc
# paths a new /proc: the three --security-opt flags. No --privileged. Kernel limits (cgroups) need the
# container's cgroup writable (docs/operating.md); without, the monitor samples them and says so.
# With less allowed, bin/serve refuses to start naming what is missing.
#
# BASE_IMAGE: a Debian bookworm with python3 (3.11), pip and venv. A host that reaches only its own
# registry builds with --build-arg BASE_IMAGE=<its copy>; .ci/base-image makes one with debootstrap.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

# python3, pip and venv: Debian's /usr/bin/python3, the one task commands and their venvs use.
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap git nodejs tini util-linux procps ca-certificates \
    python3 python3-pip python3-venv \
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

# The service's state lives in the volumes: DATA_DIR closed to the sandbox uids (0700), WORKSPACE_BASE
# passable (0711, each session's folder its own uid's). No USER: the service is the container's root.
ENV DATA_DIR=/data WORKSPACE_BASE=/workspaces PORT=8080 SANDBOX=bwrap \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN mkdir -p -m 0700 /data && mkdir -p -m 0711 /workspaces
VOLUME ["/data", "/workspaces"]
EXPOSE 8080

HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:${PORT}/health', timeout=4)"

# tini is PID 1: it forwards SIGTERM to bin/serve (which stops gunicorn and the worker gracefully) and reaps zombies.
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["bin/serve"]
