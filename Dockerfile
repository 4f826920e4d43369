# deskbridge hub: one Hypercorn trio worker in the foreground, as PID 1, so SIGTERM drains
# (jobs finish within the grace, sidecars get close 1012 and reconnect elsewhere).
# docs/deploy.md explains each choice; tests/integration/test_deploy.py runs these commands
# outside a container.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    DESKBRIDGE_LOG_FORMAT=json

WORKDIR /app
COPY constraints.txt ./
COPY common ./common
COPY hub ./hub
RUN python -m pip install -c constraints.txt ./common ./hub

RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin deskbridge
USER 10001

EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["deskbridge-hub", "serve", "--workers", "1"]
CMD ["--bind", "0.0.0.0:8080"]
