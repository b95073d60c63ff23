# term-executor: the API and the worker in one container, started by the README's command (bin/serve).
#
#   docker build -t term-executor .
#   docker run -p 8080:8080 -v te-data:/data -v te-sessions:/workspaces \
#     --security-opt seccomp=unconfined --security-opt apparmor=unconfined term-executor
#
# bubblewrap needs to create user, pid and network namespaces; Docker's default
# seccomp and AppArmor profiles forbid that, hence the two --security-opt flags
# (no --privileged needed). Without them SANDBOX=auto falls back to `none` and
# says so in /status.
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends git bubblewrap nodejs tini util-linux procps \
 && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 executor
WORKDIR /app

COPY requirements.txt ./
COPY bin/ bin/
RUN bash -c 'source bin/bootstrap requirements.txt' && chown -R executor /app

COPY manage.py ./
COPY executor_project/ executor_project/
COPY evaluations/ evaluations/
COPY assets/ assets/
COPY examples/ examples/

ENV DATA_DIR=/data WORKSPACE_BASE=/workspaces PORT=8080 PYTHONUNBUFFERED=1
RUN mkdir -p /data /workspaces && chown executor /data /workspaces
VOLUME ["/data", "/workspaces"]
USER executor
EXPOSE 8080

HEALTHCHECK --interval=30s --timeout=5s --start-period=20s \
  CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=4)"

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["bin/serve"]
