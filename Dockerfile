# syntax=docker/dockerfile:1
# rankd in a container: a release build in a Rust image, copied into a small
# Debian runtime that runs it as an unprivileged user with its data in /data.
#
#   docker build -t rankd .
#   umask 077; echo "RANKD_AUTH_TOKEN=$(openssl rand -hex 24)" > rankd.env
#   docker run -d --env-file rankd.env \
#     -p 127.0.0.1:7070:7070 -p 127.0.0.1:7071:7071 -v rankd-data:/data rankd
#
# Without a token (RANKD_AUTH_TOKEN, or a tokens file named by
# RANKD_TOKENS_FILE) rankd refuses to start: it listens on 0.0.0.0 here.
# deploy/README.md says more; tests/deployment/ runs this CMD and HEALTHCHECK.

# ---- build ------------------------------------------------------------------
FROM rust:1-slim-bookworm AS build
# make: tikv-jemalloc-sys builds jemalloc with it (gcc is in the image).
RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The release profile keeps debug info for profiling (an 81 MB binary); the
# image's drops it (12 MB) and keeps the symbols, so backtraces and perf
# still name functions.
ENV CARGO_PROFILE_RELEASE_STRIP=debuginfo
COPY . .
# The crate registry and the target dir live in BuildKit cache mounts, kept
# between builds: a source change recompiles rankd's own crates, not its
# ~170 dependencies, and a Cargo.lock change fetches only what changed.
# (A manifests-only layer with stub sources would break on every new target
# and rebuild every dependency when any of them changes.)
RUN --mount=type=cache,id=rankd-cargo-registry,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,id=rankd-cargo-git,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,id=rankd-target,target=/src/target,sharing=locked \
    cargo build --release --locked -p rankd \
 && install -D -m 0755 target/release/rankd /out/rankd

# ---- runtime ----------------------------------------------------------------
FROM debian:bookworm-slim
# ca-certificates: the rankd client subcommands' --tls trusts the system roots.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 rankd \
 && useradd --system --uid 10001 --gid rankd --home-dir /data --no-create-home \
      --shell /usr/sbin/nologin rankd \
 && install -d -o rankd -g rankd -m 0700 /data
COPY --from=build /out/rankd /usr/local/bin/rankd
COPY --chmod=0755 deploy/docker/rankd-healthcheck /usr/local/bin/rankd-healthcheck

USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
# 7070: clients (msgpack over TCP); 7071: /metrics, /healthz, /readyz.
EXPOSE 7070 7071
# /readyz answers 200 once every shard is open and clients are accepted
# (503 before, and again while shutting down). The check is bash's /dev/tcp
# (deploy/docker/rankd-healthcheck), so the image carries no curl.
# start-period: opening a large data dir replays its log first.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["rankd-healthcheck", "127.0.0.1:7071", "/readyz"]
# SIGTERM: stop accepting, answer what was read, commit, exit 0. Give it
# time (docker stop -t 60; compose stop_grace_period; Kubernetes
# terminationGracePeriodSeconds).
STOPSIGNAL SIGTERM
ENTRYPOINT ["rankd"]
CMD ["serve", "--listen", "0.0.0.0:7070", "--metrics-listen", "0.0.0.0:7071", "--data-dir", "/data"]
